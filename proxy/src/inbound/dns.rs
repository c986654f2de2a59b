//! The isolated tier's DNS stub: answers every name the workload looks up
//! with a synthetic address and remembers which name each address stands
//! for, so that a connection to that address (redirected to the proxy, which
//! reads `SO_ORIGINAL_DST`) can be mapped back to the name the client asked
//! for. Nothing is ever forwarded: the stub has no upstream resolver, so a
//! lookup reveals nothing outside the namespace and no real address leaks in.
//!
//! `veris run` creates the stub's sockets inside the workload's network
//! namespace, where nftables redirects every DNS packet (UDP and TCP port 53,
//! to any resolver) to them. Synthetic addresses come from the benchmarking
//! ranges, which no real service uses: 198.18.0.0/15 (RFC 2544) and
//! 2001:2::/48 (RFC 5180). The n-th new name gets 198.18.0.0 + n and
//! 2001:2:: + n, the same n for both families, so one table serves both.
//!
//! The wire format handled is the small part of RFC 1035 a stub needs: one
//! question, uncompressed, class IN; answers A, AAAA and ANY, and NODATA for
//! every other type. The table is bounded ([`MAX_CAPACITY`]); once full,
//! new names are answered SERVFAIL rather than by recycling an address that
//! an open connection may still be using, and the refusal is counted and
//! said ([`Lookup::refused`]) so the receipt can name the stub as the cause.
//! Names veris routes (vendor hosts, allowed hosts, the canary) have
//! [`ROUTED_RESERVE`] slots of their own beyond the capacity: a workload
//! that floods the stub with made-up names cannot make a vendor name fail.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};
use veris_accept::{accept_until, OnError};

/// Slots beyond the capacity that only names [`Names::routing`] says veris
/// routes may take, so they resolve even once made-up names filled the rest.
pub const ROUTED_RESERVE: usize = 4096;

/// Names remembered by default: one per distinct name a workload looks up.
pub const DEFAULT_CAPACITY: usize = 65_536;
/// Names remembered at most: 198.18.0.0/15 holds 131,072 addresses, and the
/// index must fit it (index 0 is unused).
pub const MAX_CAPACITY: usize = 131_000;
/// TTL of every answer. Addresses never change within a run, so clients may
/// cache them; five minutes keeps a re-lookup (and so a record) now and then.
pub const TTL: u32 = 300;
/// TCP connections served at once; more are closed as soon as accepted.
pub const MAX_TCP_CONNECTIONS: usize = 256;
/// A TCP client must send each whole query (and take each reply) within this.
pub const TCP_TIMEOUT: Duration = Duration::from_secs(10);

const BASE_V4: u32 = 0xc612_0000; // 198.18.0.0
const MASK_V4: u32 = 0xfffe_0000; // /15
const BASE_V6: u128 = 0x2001_0002_0000 << 80; // 2001:2::
const MASK_V6: u128 = !((1u128 << 80) - 1); // /48

/// Largest DNS message (the TCP length prefix is 16 bits).
const MAX_MESSAGE: usize = 65_535;
const HEADER: usize = 12;
const MAX_NAME_WIRE: usize = 255;
const MAX_LABELS: usize = 127;
const MAX_LABEL: usize = 63;
const MAX_NAME_TEXT: usize = 253;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const TYPE_ANY: u16 = 255;
const CLASS_IN: u16 = 1;

const NOERROR: u8 = 0;
const FORMERR: u8 = 1;
/// The answer when the stub cannot stand for a name: the table is full or
/// the name is not a host name. SERVFAIL says the fault is here, not in the
/// name: NXDOMAIN would claim the name does not exist and be cached as such
/// (RFC 2308), and REFUSED reads as a policy decision, which this is not.
const SERVFAIL: u8 = 2;
const NOTIMP: u8 = 4;
/// The answer for a class other than IN: there is nothing to say about it.
const REFUSED: u8 = 5;

/// Why a message got no reply at all; the caller drops it.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("the message has {len} bytes, fewer than a DNS header")]
    Truncated { len: usize },
    #[error("the message has {len} bytes, more than a DNS message may")]
    TooLong { len: usize },
    /// Answering responses could start a loop between two stubs.
    #[error("the message is a response, not a query")]
    NotQuery,
}

/// The addresses a name was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    /// The name was new: this call gave it its addresses.
    pub first: bool,
}

/// What one query asked, for the caller to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// Normalized: lower case, no trailing dot.
    pub name: String,
    pub qtype: u16,
    /// This query gave the name its addresses.
    pub first: bool,
    /// The address answered (the IPv4 one for ANY). `None` for a type
    /// without addresses (NODATA) or, for A/AAAA/ANY, when the table was
    /// full and the reply was SERVFAIL.
    pub answer: Option<IpAddr>,
    /// The table was full: the name got no address (SERVFAIL).
    pub refused: bool,
}

/// The name <-> synthetic address table, shared by the stub and the proxy.
/// IPv4 answers come from 198.18.0.0/15 (RFC 2544 benchmarking), IPv6 ones
/// from 2001:2::/48 (RFC 5180 benchmarking): ranges no real destination
/// uses, so an address in them can only have come from this table.
/// Entries are never evicted, since a client may connect long after its
/// lookup; the table is bounded instead (at most [`MAX_CAPACITY`] names of
/// at most 253 bytes, tens of megabytes in the worst case).
pub struct Names {
    table: Mutex<Table>,
    capacity: usize,
    /// Whether veris routes a name: such names may use [`ROUTED_RESERVE`].
    routed: Option<Routed>,
    /// Lookups refused because the table was full.
    refused: std::sync::atomic::AtomicU64,
}

/// Says whether veris routes a (normalized) name.
pub type Routed = Box<dyn Fn(&str) -> bool + Send + Sync>;

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .field("refused", &self.refused())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Table {
    index: HashMap<Arc<str>, u32>,
    /// `names[i - 1]` is the name of index `i`.
    names: Vec<Arc<str>>,
}

impl Names {
    /// An empty table for at most `capacity` names (clamped to [`MAX_CAPACITY`]).
    pub fn new(capacity: usize) -> Names {
        Names {
            table: Mutex::new(Table::default()),
            capacity: capacity.min(MAX_CAPACITY),
            routed: None,
            refused: Default::default(),
        }
    }

    /// Names for which `routed` is true may still be assigned once the
    /// table holds `capacity` names, up to [`ROUTED_RESERVE`] more (and never
    /// beyond [`MAX_CAPACITY`]).
    pub fn routing(mut self, routed: Routed) -> Names {
        self.routed = Some(routed);
        self
    }

    /// Lookups refused so far because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Normalizes `name` (ASCII lower case, one trailing dot removed) and
    /// gives it the next index if it is new. `None` when the name is invalid
    /// (empty, over 253 bytes, a label empty or over 63 bytes, or a byte
    /// other than a letter, digit, `-` or `_`, so that what the proxy later
    /// logs and routes by is a plain host name), when it is `localhost` or
    /// under it (always loopback, never synthetic), or when the table is full.
    pub fn assign(&self, name: &str) -> Option<Assigned> {
        let name = normalize(name)?;
        if veris_host::is_localhost(&name) {
            return None;
        }
        let mut table = self.lock();
        if let Some(&i) = table.index.get(name.as_str()) {
            return Some(addresses(i, false));
        }
        let len = table.names.len();
        let full = len >= self.capacity
            && (len >= (self.capacity + ROUTED_RESERVE).min(MAX_CAPACITY)
                || !self.routed.as_ref().is_some_and(|r| r(&name)));
        if full {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        // Fits: the length is below MAX_CAPACITY, far below u32::MAX.
        let i = table.names.len() as u32 + 1;
        let name: Arc<str> = name.into();
        table.names.push(name.clone());
        table.index.insert(name, i);
        Some(addresses(i, true))
    }

    /// The name a synthetic address stands for, IPv4 or IPv6 (an
    /// IPv4-mapped IPv6 address such as `::ffff:198.18.0.1` too, as a
    /// dual-stack socket reports it). `None` for any other address.
    pub fn name_of(&self, ip: IpAddr) -> Option<String> {
        let i = usize::try_from(offset(ip)?).ok()?.checked_sub(1)?;
        self.lock().names.get(i).map(|n| n.to_string())
    }

    /// Names assigned so far.
    pub fn len(&self) -> usize {
        self.lock().names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic elsewhere while holding the lock cannot leave the table
        // half-written (push and insert do not fail), so poisoning is ignored.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for Names {
    fn default() -> Names {
        Names::new(DEFAULT_CAPACITY)
    }
}

/// Whether `ip` lies in either synthetic range (IPv4-mapped IPv6 included),
/// assigned or not.
pub fn is_synthetic(ip: IpAddr) -> bool {
    offset(ip).is_some()
}

/// How far `ip` lies into its synthetic range; `None` outside both.
fn offset(ip: IpAddr) -> Option<u128> {
    let (addr, base, mask) = match ip.to_canonical() {
        IpAddr::V4(v4) => (u32::from(v4).into(), BASE_V4.into(), MASK_V4.into()),
        IpAddr::V6(v6) => (u128::from(v6), BASE_V6, MASK_V6),
    };
    (addr & mask == base).then(|| addr - base)
}

fn addresses(i: u32, first: bool) -> Assigned {
    Assigned {
        v4: Ipv4Addr::from(BASE_V4 + i),
        v6: Ipv6Addr::from(BASE_V6 + u128::from(i)),
        first,
    }
}

fn normalize(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let valid_label = |l: &str| {
        (1..=MAX_LABEL).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > MAX_NAME_TEXT || !name.split('.').all(valid_label) {
        return None;
    }
    Some(veris_host::Host::new(name).into_string())
}

/// Answers one DNS query in RFC 1035 wire format with a reply for the same
/// transport (at most 315 bytes, so always within UDP's 512), and says what
/// was asked when there was a name to record. Pure and bounded: it reads
/// the header and the one question, and ignores whatever follows (an EDNS
/// OPT record, say; the reply carries none, which RFC 6891 allows).
/// `Err` only when there is nothing to reply to: less than a header, more
/// than a message, or a response.
pub fn answer(query: &[u8], names: &Names) -> Result<(Vec<u8>, Option<Lookup>), DnsError> {
    if query.len() > MAX_MESSAGE {
        return Err(DnsError::TooLong { len: query.len() });
    }
    let Some(&[id0, id1, f0, f1, qd0, qd1, ..]) = query.get(..HEADER) else {
        return Err(DnsError::Truncated { len: query.len() });
    };
    let head = Head {
        id: [id0, id1],
        flags: u16::from_be_bytes([f0, f1]),
    };
    if head.flags & 0x8000 != 0 {
        return Err(DnsError::NotQuery);
    }
    if (head.flags >> 11) & 0xf != 0 {
        return Ok((head.reply(NOTIMP, &[], &[]), None));
    }
    let qdcount = u16::from_be_bytes([qd0, qd1]);
    let Some((labels, end)) = (qdcount == 1).then(|| question(query)).flatten() else {
        return Ok((head.reply(FORMERR, &[], &[]), None));
    };
    let question = &query[HEADER..end];
    let qtype = u16::from_be_bytes([query[end - 4], query[end - 3]]);
    let qclass = u16::from_be_bytes([query[end - 2], query[end - 1]]);
    if qclass != CLASS_IN {
        return Ok((head.reply(REFUSED, question, &[]), None));
    }
    // A label holding a dot would read as two: refused, not aliased.
    let text = labels
        .iter()
        .all(|l| !l.contains(&b'.'))
        .then(|| labels.join(&b'.'));
    let Some(name) = text.and_then(|t| normalize(std::str::from_utf8(&t).ok()?)) else {
        return Ok((head.reply(SERVFAIL, question, &[]), None));
    };
    let assigned = if veris_host::is_localhost(&name) {
        Some((Ipv4Addr::LOCALHOST, Ipv6Addr::LOCALHOST, false))
    } else {
        names.assign(&name).map(|a| (a.v4, a.v6, a.first))
    };
    // The name is valid, so no assignment means the table is full.
    let (rcode, first, answers) = match (assigned, qtype) {
        (None, _) => (SERVFAIL, false, vec![]),
        (Some((v4, _, first)), TYPE_A) => (NOERROR, first, vec![IpAddr::V4(v4)]),
        (Some((_, v6, first)), TYPE_AAAA) => (NOERROR, first, vec![IpAddr::V6(v6)]),
        (Some((v4, v6, first)), TYPE_ANY) => (NOERROR, first, vec![v4.into(), v6.into()]),
        (Some((_, _, first)), _) => (NOERROR, first, vec![]),
    };
    let answer = answers.first().copied();
    let lookup = Lookup {
        name,
        qtype,
        first,
        answer,
        refused: assigned.is_none(),
    };
    Ok((head.reply(rcode, question, &answers), Some(lookup)))
}

/// The query's id and flags, which the reply echoes in part.
struct Head {
    id: [u8; 2],
    flags: u16,
}

impl Head {
    /// A reply with `rcode`, echoing `question` (the query's own bytes, so
    /// case randomization survives) when it is not empty, and one record
    /// per address, its owner a pointer to the question's name.
    fn reply(&self, rcode: u8, question: &[u8], answers: &[IpAddr]) -> Vec<u8> {
        // QR, the query's opcode and RD, AA and RA, then the rcode.
        let flags = 0x8000 | (self.flags & 0x7900) | 0x0400 | 0x0080 | u16::from(rcode);
        let qdcount = u16::from(!question.is_empty());
        let mut out = Vec::with_capacity(HEADER + question.len() + 28 * answers.len());
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&qdcount.to_be_bytes());
        out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(question);
        for ip in answers {
            let (rtype, rdata) = match ip {
                IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
                IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
            };
            out.extend_from_slice(&[0xc0, HEADER as u8]);
            out.extend_from_slice(&rtype.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&TTL.to_be_bytes());
            out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            out.extend_from_slice(&rdata);
        }
        out
    }
}

/// The question's labels and the offset just past its type and class, or
/// `None` when it is malformed: truncated, compressed (a pointer has
/// nothing to point back to in the first name, and refusing them keeps the
/// reading linear), an extended label type, or over RFC 1035's limits.
fn question(msg: &[u8]) -> Option<(Vec<&[u8]>, usize)> {
    let mut labels = Vec::new();
    let mut pos = HEADER;
    loop {
        let len = usize::from(*msg.get(pos)?);
        if len > MAX_LABEL || pos + 1 + len - HEADER > MAX_NAME_WIRE {
            return None;
        }
        pos += 1;
        if len == 0 {
            break;
        }
        labels.push(msg.get(pos..pos + len)?);
        if labels.len() > MAX_LABELS {
            return None;
        }
        pos += len;
    }
    msg.get(pos..pos + 4)?;
    Some((labels, pos + 4))
}

/// Called with each query's [`Lookup`], inline on the serving task: keep it short.
pub type OnLookup = Arc<dyn Fn(&Lookup) + Send + Sync>;

/// Answers DNS over UDP on `socket` until `stop` resolves. Every error is
/// the client's or the moment's (a malformed datagram, a peer gone), so it
/// is logged at debug and the loop goes on.
pub async fn serve_udp(
    socket: UdpSocket,
    names: Arc<Names>,
    on_lookup: OnLookup,
    stop: impl Future<Output = ()>,
) {
    if let Ok(addr) = socket.local_addr() {
        info!(%addr, "DNS stub answering over UDP");
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    tokio::pin!(stop);
    loop {
        let (n, peer) = tokio::select! {
            _ = &mut stop => break,
            received = socket.recv_from(&mut buf) => match received {
                Ok(r) => r,
                Err(e) => {
                    debug!(error = %e, "DNS stub: receiving failed");
                    // Whatever failed may fail again at once: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match answer(&buf[..n], &names) {
            Ok((reply, lookup)) => {
                if let Some(lookup) = lookup {
                    seen(&lookup, &on_lookup);
                }
                if let Err(e) = socket.send_to(&reply, peer).await {
                    debug!(error = %e, %peer, "DNS stub: sending a reply failed");
                }
            }
            Err(e) => debug!(error = %e, %peer, "DNS stub: datagram dropped"),
        }
    }
}

/// Answers DNS over TCP (RFC 7766: each message behind a 2-byte length,
/// several per connection) on `listener` until `stop` resolves, then closes
/// every connection. At most [`MAX_TCP_CONNECTIONS`] are served at once.
pub async fn serve_tcp(
    listener: TcpListener,
    names: Arc<Names>,
    on_lookup: OnLookup,
    stop: impl Future<Output = ()>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "DNS stub answering over TCP");
    }
    let slots = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    // Retry never ends the loop with an error.
    let _ = accept_until(listener, stop, OnError::Retry, |stream, peer| {
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "DNS stub: too many TCP connections; closed");
            return;
        };
        let (names, on_lookup, cancel) = (names.clone(), on_lookup.clone(), cancel.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = tcp_connection(stream, &names, &on_lookup) => {
                    if let Err(e) = r {
                        debug!(error = %e, %peer, "DNS stub: TCP connection ended");
                    }
                }
            }
            drop(slot);
        });
    })
    .await;
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
}

/// Serves one TCP connection until the client closes it, stalls, sends a
/// zero length or a message with nothing to reply to.
async fn tcp_connection(
    mut stream: TcpStream,
    names: &Names,
    on_lookup: &OnLookup,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let read = async {
            let len = match stream.read_u16().await {
                Ok(len) => usize::from(len),
                // The client closing between messages is the normal end.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e),
            };
            // A u16 length never exceeds MAX_MESSAGE; zero is not a message.
            if len == 0 {
                return Ok(None);
            }
            stream.read_exact(&mut buf[..len]).await?;
            Ok(Some(len))
        };
        let Some(len) = tokio::time::timeout(TCP_TIMEOUT, read).await?? else {
            return Ok(());
        };
        let (reply, lookup) = match answer(&buf[..len], names) {
            Ok(answered) => answered,
            Err(e) => {
                debug!(error = %e, "DNS stub: TCP message dropped; closing");
                return Ok(());
            }
        };
        if let Some(lookup) = lookup {
            seen(&lookup, on_lookup);
        }
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&(reply.len() as u16).to_be_bytes());
        framed.extend_from_slice(&reply);
        tokio::time::timeout(TCP_TIMEOUT, stream.write_all(&framed)).await??;
    }
}

fn seen(lookup: &Lookup, on_lookup: &OnLookup) {
    debug!(name = %lookup.name, qtype = lookup.qtype, first = lookup.first, "DNS stub: lookup");
    on_lookup(lookup);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `name` (split at dots, no compression) with RD set.
    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.split('.').filter(|l| !l.is_empty()) {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, qtype as u8, 0, 1]);
        let hi = q.len() - 4;
        q[hi] = (qtype >> 8) as u8;
        q
    }

    /// Reads a reply independently of `Head::reply`, checking every fixed
    /// field: (id, rcode, question count, answered addresses).
    fn parse(r: &[u8]) -> (u16, u8, u16, Vec<IpAddr>) {
        assert!((12..=512).contains(&r.len()), "reply of {} bytes", r.len());
        let at = |i: usize| u16::from_be_bytes([r[i], r[i + 1]]);
        assert_eq!(at(2) & 0x8480, 0x8480, "QR, AA and RA set");
        assert_eq!((at(8), at(10)), (0, 0));
        let mut pos = 12;
        for _ in 0..at(4) {
            while r[pos] != 0 {
                pos += 1 + usize::from(r[pos]);
            }
            pos += 5;
        }
        let mut addrs = Vec::new();
        for _ in 0..at(6) {
            assert_eq!(
                (at(pos), at(pos + 4), at(pos + 6), at(pos + 8)),
                (0xc00c, 1, 0, 300)
            );
            let data = &r[pos + 12..pos + 12 + usize::from(at(pos + 10))];
            addrs.push(match (at(pos + 2), data.len()) {
                (1, 4) => IpAddr::from(<[u8; 4]>::try_from(data).unwrap()),
                (28, 16) => IpAddr::from(<[u8; 16]>::try_from(data).unwrap()),
                other => panic!("unexpected record {other:?}"),
            });
            pos += 12 + data.len();
        }
        assert_eq!(pos, r.len(), "trailing bytes in the reply");
        (at(0), (at(2) & 0xf) as u8, at(4), addrs)
    }

    fn ask(names: &Names, q: &[u8]) -> ((u16, u8, u16, Vec<IpAddr>), Option<Lookup>) {
        let (r, lookup) = answer(q, names).expect("a reply");
        (parse(&r), lookup)
    }

    /// The addresses answered for `name`.
    fn addrs(names: &Names, name: &str, qtype: u16) -> Vec<IpAddr> {
        ask(names, &query(1, name, qtype)).0 .3
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_and_aaaa_share_an_index() {
        let names = Names::default();
        let ((id, rcode, qd, a), l) = ask(&names, &query(7, "api.stripe.com", TYPE_A));
        assert_eq!((id, rcode, qd, a), (7, NOERROR, 1, vec![ip("198.18.0.1")]));
        let l = l.unwrap();
        assert_eq!(
            (l.name.as_str(), l.qtype, l.first),
            ("api.stripe.com", 1, true)
        );
        assert_eq!(l.answer, Some(ip("198.18.0.1")));
        assert_eq!(
            addrs(&names, "api.stripe.com", TYPE_AAAA),
            [ip("2001:2::1")]
        );
        assert_eq!(addrs(&names, "example.org", TYPE_AAAA), [ip("2001:2::2")]);
        let both = [ip("198.18.0.2"), ip("2001:2::2")];
        assert_eq!(addrs(&names, "example.org", TYPE_ANY), both);
    }

    #[test]
    fn same_name_twice_keeps_its_address() {
        let names = Names::default();
        let (a, first) = ask(&names, &query(1, "x.test", TYPE_A));
        let (b, again) = ask(&names, &query(2, "x.test", TYPE_A));
        assert_eq!(a.3, b.3);
        assert!(first.unwrap().first && !again.unwrap().first);
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn case_and_trailing_dot_are_normalized() {
        let names = Names::new(4);
        let first = names.assign("Api.Example.COM.").unwrap();
        assert!(first.first);
        let again = Assigned {
            first: false,
            ..first
        };
        assert_eq!(names.assign("api.example.com"), Some(again));
        let (r, l) = ask(&names, &query(1, "API.example.Com", TYPE_A));
        assert_eq!(
            (r.3, l.unwrap().name),
            (vec![first.v4.into()], "api.example.com".into())
        );
        // The question is echoed as asked (0x20 case randomization).
        let (raw, _) = answer(&query(1, "API.example.Com", TYPE_A), &names).unwrap();
        assert!(raw.windows(3).any(|w| w == b"API"));
        for bad in ["", ".", "a..b", "a..", "a b.com", "a/b", &"a".repeat(254)] {
            assert_eq!(names.assign(bad), None, "{bad:?}");
        }
        assert_eq!(names.assign(&"a".repeat(64)), None);
        assert!(names.assign(&"a".repeat(63)).is_some());
    }

    #[test]
    fn name_of_round_trips_including_mapped() {
        let names = Names::default();
        let a = names.assign("one.test").unwrap();
        names.assign("two.test").unwrap();
        let name_of = |s: &str| names.name_of(ip(s));
        assert_eq!(names.name_of(a.v4.into()).as_deref(), Some("one.test"));
        assert_eq!(names.name_of(a.v6.into()).as_deref(), Some("one.test"));
        assert_eq!(name_of("::ffff:198.18.0.1").as_deref(), Some("one.test"));
        assert_eq!(name_of("2001:2::2").as_deref(), Some("two.test"));
        for unknown in [
            "198.18.0.0",
            "198.18.0.3",
            "10.0.0.1",
            "2001:2::",
            "2001:3::1",
        ] {
            assert_eq!(name_of(unknown), None, "{unknown}");
        }
        for yes in ["198.19.255.255", "::ffff:198.18.0.9", "2001:2:0:ffff::1"] {
            assert!(is_synthetic(ip(yes)), "{yes}");
        }
        assert!(!is_synthetic(ip("198.20.0.1")) && !is_synthetic(ip("2001:2:1::1")));
    }

    #[test]
    fn localhost_is_loopback_and_never_assigned() {
        let names = Names::default();
        let (r, l) = ask(&names, &query(1, "localhost", TYPE_A));
        assert_eq!(
            (r.3, l.unwrap().answer),
            (vec![ip("127.0.0.1")], Some(ip("127.0.0.1")))
        );
        assert_eq!(addrs(&names, "Web.LocalHost", TYPE_AAAA), [ip("::1")]);
        assert_eq!(names.assign("localhost"), None);
        assert!(names.is_empty());
        // Only the label, not a suffix of one.
        assert_eq!(addrs(&names, "notlocalhost", TYPE_A), [ip("198.18.0.1")]);
    }

    #[test]
    fn txt_is_nodata_but_assigned() {
        let names = Names::default();
        for (i, qtype) in [16u16, 15, 65, 64].into_iter().enumerate() {
            let (r, l) = ask(&names, &query(1, "txt.test", qtype));
            assert_eq!((r.1, r.2, r.3.len()), (NOERROR, 1, 0));
            let l = l.unwrap();
            assert_eq!((l.qtype, l.first, l.answer), (qtype, i == 0, None));
        }
        assert_eq!(names.name_of(ip("198.18.0.1")).as_deref(), Some("txt.test"));
    }

    #[test]
    fn qdcount_zero_and_two_are_formerr() {
        let names = Names::default();
        for qd in [0u8, 2] {
            let mut q = query(3, "a.test", TYPE_A);
            q[5] = qd;
            let (r, l) = ask(&names, &q);
            assert_eq!((r.0, r.1, r.2, l), (3, FORMERR, 0, None));
        }
        assert!(names.is_empty());
    }

    #[test]
    fn compression_pointer_in_question_is_formerr() {
        // "a" then a pointer back to it instead of the root label.
        let mut q = query(1, "a", TYPE_A);
        q.splice(14.., [0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(ask(&Names::default(), &q).0 .1, FORMERR);
    }

    #[test]
    fn label_of_64_bytes_is_an_error() {
        // On the wire a length byte of 64 is an extended label type.
        let (r, l) = ask(&Names::default(), &query(1, &"a".repeat(64), TYPE_A));
        assert_eq!((r.1, r.3.len(), l), (FORMERR, 0, None));
        // Over 255 wire bytes in 63-byte labels.
        let long = [&"b".repeat(63)[..]; 4].join(".");
        assert_eq!(
            ask(&Names::default(), &query(1, &long, TYPE_A)).0 .1,
            FORMERR
        );
        // A label holding a dot is not taken for two labels.
        let mut q = query(1, "a", TYPE_A);
        q.splice(12..14, *b"\x03a.b");
        assert_eq!(ask(&Names::default(), &q).0 .1, SERVFAIL);
    }

    #[test]
    fn truncated_message() {
        let names = Names::default();
        let q = query(1, "truncated.test", TYPE_A);
        for n in 0..12 {
            assert!(matches!(
                answer(&q[..n], &names),
                Err(DnsError::Truncated { .. })
            ));
        }
        for n in 12..q.len() {
            assert_eq!(ask(&names, &q[..n]).0 .1, FORMERR, "{n} bytes");
        }
        let long = answer(&vec![0; 65_536], &names);
        assert!(matches!(long, Err(DnsError::TooLong { .. })));
        let mut response = q.clone();
        response[2] |= 0x80;
        assert!(matches!(answer(&response, &names), Err(DnsError::NotQuery)));
    }

    #[test]
    fn opcode_2_is_notimp() {
        let mut q = query(0xbeef, "a.test", TYPE_A);
        q[2] |= 2 << 3;
        let (raw, l) = answer(&q, &Names::default()).unwrap();
        let (id, rcode, qd, _) = parse(&raw);
        assert_eq!((id, rcode, qd, l), (0xbeef, NOTIMP, 0, None));
        assert_eq!(raw[2] >> 3 & 0xf, 2, "the opcode is echoed");
    }

    #[test]
    fn class_other_than_in_is_refused_and_edns_is_ignored() {
        let names = Names::default();
        let mut q = query(1, "version.bind", 16);
        *q.last_mut().unwrap() = 3; // CH
        assert_eq!(ask(&names, &q).0 .1, REFUSED);
        // An EDNS OPT record in the additional section (ARCOUNT 1).
        let mut q = query(1, "edns.test", TYPE_A);
        q[11] = 1;
        q.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(ask(&names, &q).0 .3, [ip("198.18.0.1")]);
    }

    #[test]
    fn full_table_is_servfail() {
        let names = Names::new(2);
        addrs(&names, "one.test", TYPE_A);
        addrs(&names, "two.test", TYPE_A);
        let (r, l) = ask(&names, &query(1, "three.test", TYPE_A));
        assert_eq!((r.1, r.2, r.3.len()), (SERVFAIL, 1, 0));
        let l = l.unwrap();
        assert_eq!(
            (l.name.as_str(), l.first, l.answer),
            ("three.test", false, None)
        );
        // Known names and localhost still answer.
        assert_eq!(addrs(&names, "one.test", TYPE_A), [ip("198.18.0.1")]);
        assert_eq!(addrs(&names, "localhost", TYPE_A), [ip("127.0.0.1")]);
        assert_eq!(Names::new(usize::MAX).capacity, MAX_CAPACITY);
        assert!((MAX_CAPACITY as u32) < !MASK_V4, "every index fits the /15");
        assert!(l.refused);
        assert_eq!(names.refused(), 1);
    }

    #[test]
    fn routed_names_resolve_once_made_up_names_filled_the_table() {
        let names = Names::new(2).routing(Box::new(|n: &str| n == "api.stripe.com"));
        addrs(&names, "flood-1.test", TYPE_A);
        addrs(&names, "flood-2.test", TYPE_A);
        assert!(addrs(&names, "flood-3.test", TYPE_A).is_empty());
        let (r, l) = ask(&names, &query(1, "api.stripe.com", TYPE_A));
        assert_eq!((r.1, r.3), (NOERROR, vec![ip("198.18.0.3")]));
        assert!(!l.unwrap().refused);
        assert_eq!(names.refused(), 1, "only the made-up name was refused");
        // The reserve is bounded too.
        let many = Names::new(0).routing(Box::new(|_: &str| true));
        for i in 0..ROUTED_RESERVE {
            assert!(many.assign(&format!("r{i}.test")).is_some());
        }
        assert!(many.assign("one-more.test").is_none());
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let names = Names::new(64);
        let seeds = [
            query(1, "seed.example.com", TYPE_A),
            query(2, "x", TYPE_ANY),
        ];
        for round in 0..50_000 {
            let mut msg = match round % 2 {
                0 => (0..next() % 300).map(|_| next() as u8).collect(),
                _ => seeds[round % 4 / 2].clone(),
            };
            // Flip a few bytes, keep the header a query half the time, cut.
            for _ in 0..next() % 4 {
                if let Some(len) = std::num::NonZeroUsize::new(msg.len()) {
                    msg[next() as usize % len] = next() as u8;
                }
            }
            if round % 4 < 2 && msg.len() > 2 {
                msg[2] &= 0x07;
            }
            msg.truncate((next() % 320) as usize);
            if let Ok((reply, _)) = answer(&msg, &names) {
                assert!(reply.len() <= 512 && reply[..2] == msg[..2]);
            }
        }
        assert!(names.len() <= 64);
    }

    /// An `on_lookup` that counts the lookups it is given.
    fn counter() -> (OnLookup, Arc<std::sync::atomic::AtomicUsize>) {
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = seen.clone();
        let on_lookup: OnLookup = Arc::new(move |_: &Lookup| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        (on_lookup, seen)
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn serve_udp_answers() {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let ((on_lookup, seen), names) = (counter(), Arc::new(Names::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async { _ = stopped.await };
        let server = tokio::spawn(serve_udp(socket, names.clone(), on_lookup, stopped));
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(addr).await.unwrap();
        let mut buf = [0u8; 600];
        // Garbage is dropped without a reply and the stub goes on.
        client.send(b"junk").await.unwrap();
        for (id, qtype, want) in [(1, TYPE_A, "198.18.0.1"), (2, TYPE_AAAA, "2001:2::1")] {
            client.send(&query(id, "udp.test", qtype)).await.unwrap();
            let n = tokio::time::timeout(LIMIT, client.recv(&mut buf))
                .await
                .unwrap()
                .unwrap();
            let (got, _, _, a) = parse(&buf[..n]);
            assert_eq!((got, a), (id, vec![ip(want)]));
        }
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(names.name_of(ip("198.18.0.1")).as_deref(), Some("udp.test"));
        stop.send(()).unwrap();
        tokio::time::timeout(LIMIT, server).await.unwrap().unwrap();
    }

    /// Sends one framed query on `stream`; (id, addresses) of the reply.
    async fn tcp_ask(stream: &mut TcpStream, q: &[u8]) -> (u16, Vec<IpAddr>) {
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(q);
        stream.write_all(&framed).await.unwrap();
        let read = async {
            let mut reply = vec![0u8; usize::from(stream.read_u16().await.unwrap())];
            stream.read_exact(&mut reply).await.unwrap();
            reply
        };
        let (id, _, _, a) = parse(&tokio::time::timeout(LIMIT, read).await.unwrap());
        (id, a)
    }

    /// Whether the server closed `stream` (EOF or reset) within the limit.
    async fn closed(stream: &mut TcpStream) -> bool {
        let read = tokio::time::timeout(LIMIT, stream.read(&mut [0u8; 1])).await;
        matches!(read, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test]
    async fn serve_tcp_answers_and_survives_a_zero_length() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ((on_lookup, seen), names) = (counter(), Arc::new(Names::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async { _ = stopped.await };
        let server = tokio::spawn(serve_tcp(listener, names, on_lookup, stopped));
        let mut c = TcpStream::connect(addr).await.unwrap();
        let a = tcp_ask(&mut c, &query(1, "tcp.test", TYPE_A)).await;
        assert_eq!(a, (1, vec![ip("198.18.0.1")]));
        let any = tcp_ask(&mut c, &query(2, "other.test", TYPE_ANY)).await;
        assert_eq!(any, (2, vec![ip("198.18.0.2"), ip("2001:2::2")]));

        // A zero length closes that connection...
        let mut zero = TcpStream::connect(addr).await.unwrap();
        zero.write_all(&[0, 0]).await.unwrap();
        assert!(closed(&mut zero).await);
        // ...and the listener answers the next one; the first still works.
        let mut next = TcpStream::connect(addr).await.unwrap();
        let aaaa = tcp_ask(&mut next, &query(3, "TCP.test.", TYPE_AAAA)).await;
        assert_eq!(aaaa, (3, vec![ip("2001:2::1")]));
        assert_eq!(tcp_ask(&mut c, &query(4, "tcp.test", TYPE_A)).await.0, 4);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 4);

        stop.send(()).unwrap();
        tokio::time::timeout(LIMIT, server).await.unwrap().unwrap();
        // Stopping closed the open connections too.
        assert!(closed(&mut c).await);
    }
}
