//! The transparent tier's QUIC sink: a UDP socket that receives the
//! workload's redirected UDP 443 datagrams, never answers (so clients give up
//! on QUIC and fall back to TCP, where the TCP redirect catches them) and
//! records each attempt as a `quic` ledger entry (DESIGN §8).
//!
//! A QUIC Initial packet is protected with keys anyone can derive from its
//! destination connection id (RFC 9001 §5.2), so the sink removes header
//! protection, decrypts the payload, reassembles the CRYPTO frames (bounded,
//! possibly across several packets and datagrams) and reads the SNI out of
//! the ClientHello. Clients retransmit their Initial while nobody answers:
//! datagrams of one attempt (same original destination, client port and
//! DCID) are counted into one entry's `attempts`, written when the attempt
//! goes quiet, grows old, is evicted for space, or the sink shuts down.
//!
//! The original destination: with an nftables `redirect`, the datagram's
//! header (and so `IP_ORIGDSTADDR`) names the sink itself, and
//! `SO_ORIGINAL_DST` is TCP-only. The ruleset therefore also source-NATs the
//! redirected datagrams to their original destination address
//! (`snat to ct original ip daddr`, deploy/veris.nft), so the peer address the
//! sink sees *is* the original destination (its port stays the client's, which
//! keeps attempts apart). The redirect matches only UDP port 443, so the
//! original port is 443. No unsafe code is needed for any of this.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::quic::{DirectionalKeys, Keys, Version};
use tokio::net::UdpSocket;
use tracing::{debug, info, warn};
use veris_receipt::Entry;

use crate::request::recorder::Recorder;

/// Default address of the sink (UDP; dual-stack). The same number as the TLS
/// listener's default is fine: UDP and TCP ports are separate.
pub const DEFAULT_QUIC_LISTEN: &str = "[::]:8443";
/// Attempts tracked at once; the least recently seen is written out to make room.
pub const MAX_FLOWS: usize = 1024;
/// An attempt with no datagram for this long is over: its entry is written.
pub const IDLE: Duration = Duration::from_secs(2);
/// An attempt still retransmitting after this long is written anyway (a
/// later datagram starts a new entry), so evidence is never held back longer.
pub const MAX_AGE: Duration = Duration::from_secs(10);
/// How often idle attempts are looked for.
const SWEEP: Duration = Duration::from_millis(500);
/// The QUIC port the redirect matches (deploy/veris.nft).
const QUIC_PORT: u16 = 443;
/// CRYPTO stream bytes kept per attempt: a ClientHello with a post-quantum
/// key share is about 1.8 KB.
const MAX_CRYPTO: usize = 8 * 1024;
/// Disjoint CRYPTO ranges kept per attempt (clients may scatter frames).
const MAX_RANGES: usize = 32;
/// Coalesced QUIC packets looked at per datagram.
const MAX_PACKETS_PER_DATAGRAM: usize = 8;
/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;
/// Longest connection id QUIC v1/v2 allow.
const MAX_CID: usize = 20;

const VERSION_1: u32 = 0x0000_0001;
const VERSION_2: u32 = 0x6b33_43cf;
/// Receives redirected UDP 443 datagrams on `socket` until `shutdown`
/// resolves, never answering, and records one [`Entry::Quic`] per attempt.
/// Pending attempts are written before it returns.
pub async fn serve(
    socket: UdpSocket,
    recorder: Arc<dyn Recorder>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut sink = Sink::new(MAX_FLOWS);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = sweep.tick() => record(recorder.as_ref(), sink.expire(Instant::now())).await,
            received = socket.recv_from(&mut buf) => match received {
                Ok((n, peer)) => {
                    let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
                    if peer.ip().is_loopback() {
                        // Loopback is exempt from the redirect, and a
                        // redirected datagram arrives from its original
                        // destination: this one came to the sink directly.
                        debug!(%peer, "a datagram reached the QUIC sink directly, not through the redirect; ignored");
                        continue;
                    }
                    let data = buf.get(..n).unwrap_or_default();
                    record(recorder.as_ref(), sink.datagram(peer, data, Instant::now())).await;
                }
                Err(e) => {
                    warn!(error = %e, "receiving on the QUIC sink failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    record(recorder.as_ref(), sink.drain()).await;
    Ok(())
}

async fn record(recorder: &dyn Recorder, entries: Vec<Entry>) {
    for entry in entries {
        if let Entry::Quic {
            host,
            dst,
            attempts,
        } = &entry
        {
            info!(host = host.as_deref().unwrap_or("-"), %dst, attempts, "QUIC attempt caught by the sink; the client falls back to TCP");
        }
        if let Err(e) = recorder.record(entry).await {
            warn!(error = %e, "a QUIC attempt could not be recorded");
        }
    }
}

/// One attempt: the original destination with the client's port, and the DCID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FlowKey {
    peer: SocketAddr,
    dcid: Vec<u8>,
}

#[derive(Debug)]
struct Flow {
    attempts: u64,
    host: Option<String>,
    /// The SNI was found or can no longer be: CRYPTO data is not kept.
    decided: bool,
    crypto: Vec<u8>,
    /// Disjoint, sorted byte ranges of `crypto` received so far.
    ranges: Vec<(usize, usize)>,
    first_seen: Instant,
    last_seen: Instant,
}

/// The attempts being tracked, bounded by `max_flows`. Pure state: the
/// caller feeds datagrams and time and writes the entries it gets back.
#[derive(Debug)]
pub struct Sink {
    flows: HashMap<FlowKey, Flow>,
    max_flows: usize,
}

impl Sink {
    /// An empty table holding at most `max_flows` attempts (at least one).
    pub fn new(max_flows: usize) -> Sink {
        Sink {
            flows: HashMap::new(),
            max_flows: max_flows.max(1),
        }
    }

    /// Attempts being tracked.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Takes in one datagram from `peer` (the original destination, see the
    /// module comment). Returns the entries of attempts that had to be
    /// closed: one that grew too old, or the least recently seen when the
    /// table is full.
    pub fn datagram(&mut self, peer: SocketAddr, data: &[u8], now: Instant) -> Vec<Entry> {
        let parsed = parse_datagram(data);
        let key = FlowKey {
            peer,
            dcid: parsed.dcid,
        };
        let mut closed = Vec::new();
        if let Some(flow) = self.flows.get(&key) {
            if now.duration_since(flow.first_seen) >= MAX_AGE {
                if let Some(flow) = self.flows.remove(&key) {
                    closed.push(entry(&key, flow));
                }
            }
        }
        if !self.flows.contains_key(&key) && self.flows.len() >= self.max_flows {
            let oldest = self
                .flows
                .iter()
                .min_by_key(|(_, f)| f.last_seen)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                if let Some(flow) = self.flows.remove(&k) {
                    closed.push(entry(&k, flow));
                }
            }
        }
        let flow = self.flows.entry(key).or_insert_with(|| Flow {
            attempts: 0,
            host: None,
            decided: false,
            crypto: Vec::new(),
            ranges: Vec::new(),
            first_seen: now,
            last_seen: now,
        });
        flow.attempts = flow.attempts.saturating_add(1);
        flow.last_seen = now;
        // A datagram that is not an Initial we can read (another version,
        // garbage, a truncated packet) is counted all the same.
        for (offset, bytes) in &parsed.crypto {
            if flow.decided {
                break;
            }
            flow.add_crypto(*offset, bytes);
        }
        closed
    }

    /// Closes the attempts that went quiet or grew old by `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<Entry> {
        let done: Vec<FlowKey> = self
            .flows
            .iter()
            .filter(|(_, f)| {
                now.duration_since(f.last_seen) >= IDLE
                    || now.duration_since(f.first_seen) >= MAX_AGE
            })
            .map(|(k, _)| k.clone())
            .collect();
        self.close(done)
    }

    /// Closes every attempt (shutdown).
    pub fn drain(&mut self) -> Vec<Entry> {
        let all: Vec<FlowKey> = self.flows.keys().cloned().collect();
        self.close(all)
    }

    fn close(&mut self, mut keys: Vec<FlowKey>) -> Vec<Entry> {
        // In the order the attempts started, so the ledger reads in time order.
        keys.sort_by_key(|k| self.flows.get(k).map(|f| f.first_seen));
        keys.into_iter()
            .filter_map(|k| self.flows.remove(&k).map(|f| entry(&k, f)))
            .collect()
    }
}

fn entry(key: &FlowKey, flow: Flow) -> Entry {
    Entry::Quic {
        host: flow.host,
        dst: SocketAddr::new(key.peer.ip(), QUIC_PORT).to_string(),
        attempts: flow.attempts,
    }
}

impl Flow {
    /// Adds CRYPTO bytes at `offset`; once the stream from 0 holds a whole
    /// handshake message, reads the SNI and stops keeping bytes.
    fn add_crypto(&mut self, offset: u64, bytes: &[u8]) {
        let Ok(start) = usize::try_from(offset) else {
            return self.give_up();
        };
        let Some(end) = start.checked_add(bytes.len()).filter(|e| *e <= MAX_CRYPTO) else {
            return self.give_up();
        };
        if bytes.is_empty() {
            return;
        }
        if self.crypto.len() < end {
            self.crypto.resize(end, 0);
        }
        // Retransmitted CRYPTO data is identical, so overwriting is harmless.
        self.crypto[start..end].copy_from_slice(bytes);
        self.ranges.push((start, end));
        self.ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.ranges.len());
        for &(s, e) in &self.ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.ranges = merged;
        if self.ranges.len() > MAX_RANGES {
            return self.give_up();
        }
        let contiguous = match self.ranges.first() {
            Some(&(0, e)) => e,
            _ => return,
        };
        let Some(head) = self.crypto.get(..4) else {
            return;
        };
        if contiguous < 4 {
            return;
        }
        if head[0] != HANDSHAKE_CLIENT_HELLO {
            return self.give_up();
        }
        let len = usize::from(head[1]) << 16 | usize::from(head[2]) << 8 | usize::from(head[3]);
        if 4 + len > MAX_CRYPTO {
            return self.give_up();
        }
        if contiguous >= 4 + len {
            self.host = client_hello_sni(&self.crypto[4..4 + len]);
            self.give_up();
        }
    }

    /// Nothing more to learn: drop the buffered CRYPTO bytes.
    fn give_up(&mut self) {
        self.decided = true;
        self.crypto = Vec::new();
        self.ranges = Vec::new();
    }
}

/// What one datagram told us.
#[derive(Debug, Default)]
struct Parsed {
    /// DCID of its first long-header packet (empty when there is none).
    dcid: Vec<u8>,
    /// CRYPTO frames of its Initial packets: (stream offset, bytes).
    crypto: Vec<(u64, Vec<u8>)>,
}

fn parse_datagram(data: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut rest = data;
    for i in 0..MAX_PACKETS_PER_DATAGRAM {
        let Some(packet) = long_header(rest) else {
            break;
        };
        if i == 0 {
            parsed.dcid = packet.dcid.to_vec();
        }
        if let (Some(version), Some(pn_offset)) = (packet.initial, packet.pn_offset) {
            if let Some(plain) = open_initial(version, &rest[..packet.end], packet.dcid, pn_offset)
            {
                parsed.crypto.extend(crypto_frames(&plain));
            }
        }
        rest = &rest[packet.end..];
    }
    parsed
}

/// A long-header packet at the start of a datagram.
struct LongPacket<'a> {
    dcid: &'a [u8],
    /// Set for an Initial packet of a version we can decrypt.
    initial: Option<u32>,
    /// Where the (protected) packet number starts, for packets that have one.
    pn_offset: Option<usize>,
    /// Where this packet ends (the next coalesced one starts).
    end: usize,
}

fn long_header(buf: &[u8]) -> Option<LongPacket<'_>> {
    let mut c = Cursor { buf, pos: 0 };
    let first = c.u8()?;
    if first & 0x80 == 0 {
        return None;
    }
    let version = u32::from_be_bytes(c.take(4)?.try_into().ok()?);
    let dcid_len = usize::from(c.u8()?);
    let dcid = c.take(dcid_len)?;
    let scid_len = usize::from(c.u8()?);
    c.take(scid_len)?;
    let kind = (first >> 4) & 0x03;
    let initial = match version {
        VERSION_1 => kind == 0,
        VERSION_2 => kind == 1,
        // Version negotiation or an unknown version: nothing more to read.
        _ => {
            return Some(LongPacket {
                dcid,
                initial: None,
                pn_offset: None,
                end: buf.len(),
            })
        }
    };
    if dcid_len > MAX_CID || scid_len > MAX_CID {
        return None;
    }
    let retry = match version {
        VERSION_1 => kind == 3,
        _ => kind == 0,
    };
    if retry {
        return Some(LongPacket {
            dcid,
            initial: None,
            pn_offset: None,
            end: buf.len(),
        });
    }
    if initial {
        let token_len = usize::try_from(c.varint()?).ok()?;
        c.take(token_len)?;
    }
    let length = usize::try_from(c.varint()?).ok()?;
    let pn_offset = c.pos;
    let end = pn_offset.checked_add(length).filter(|e| *e <= buf.len())?;
    Some(LongPacket {
        dcid,
        initial: initial.then_some(version),
        pn_offset: Some(pn_offset),
        end,
    })
}

/// The client's Initial keys for `dcid` (RFC 9001 §5.2; RFC 9369 §3.3 for
/// v2), as the server derives them.
fn client_initial_keys(version: u32, dcid: &[u8]) -> Option<DirectionalKeys> {
    Some(initial_keys(version, dcid, rustls::Side::Server)?.remote)
}

/// Both directions' Initial keys for `dcid`, seen from `side`, by rustls
/// (AES-128-GCM, the Initial packets' cipher suite).
fn initial_keys(version: u32, dcid: &[u8], side: rustls::Side) -> Option<Keys> {
    let version = match version {
        VERSION_1 => Version::V1,
        VERSION_2 => Version::V2,
        _ => return None,
    };
    let rustls::SupportedCipherSuite::Tls13(suite) =
        rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256
    else {
        return None;
    };
    Some(Keys::initial(version, suite, suite.quic?, dcid, side))
}

/// Removes header protection from one Initial packet and decrypts it;
/// `None` when it does not authenticate (or is too short to try).
fn open_initial(version: u32, packet: &[u8], dcid: &[u8], pn_offset: usize) -> Option<Vec<u8>> {
    let keys = client_initial_keys(version, dcid)?;
    // The sample starts 4 bytes after the packet number's start.
    packet.get(pn_offset + 4..pn_offset + 20)?;
    let mut packet = packet.to_vec();
    let (head, rest) = packet.split_at_mut(pn_offset);
    let (pn_field, after) = rest.split_at_mut(4);
    let first = head.first_mut()?;
    keys.header
        .decrypt_in_place(&after[..16], first, pn_field)
        .ok()?;
    let pn_len = usize::from(packet[0] & 0x03) + 1;
    let pn = packet[pn_offset..pn_offset + pn_len]
        .iter()
        .fold(0u64, |pn, b| pn << 8 | u64::from(*b));
    let (header, payload) = packet.split_at_mut(pn_offset + pn_len);
    let plain = keys.packet.decrypt_in_place(pn, header, payload).ok()?;
    Some(plain.to_vec())
}

/// The CRYPTO frames of a decrypted Initial payload. Frames an Initial may
/// carry (PADDING, PING, ACK, CRYPTO, CONNECTION_CLOSE) are stepped over;
/// anything else ends the walk with what was found so far.
fn crypto_frames(plain: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut c = Cursor { buf: plain, pos: 0 };
    // Every step consumes at least one byte, so this is bounded by the payload.
    while c.pos < plain.len() {
        let Some(kind) = c.varint() else { break };
        let ok = match kind {
            0x00 | 0x01 => Some(()),
            0x02 | 0x03 => skip_ack(&mut c, kind == 0x03),
            0x06 => (|| {
                let offset = c.varint()?;
                let len = usize::try_from(c.varint()?).ok()?;
                out.push((offset, c.take(len)?.to_vec()));
                Some(())
            })(),
            0x1c => (|| {
                c.varint()?;
                c.varint()?;
                let len = usize::try_from(c.varint()?).ok()?;
                c.take(len)?;
                Some(())
            })(),
            _ => None,
        };
        if ok.is_none() {
            break;
        }
    }
    out
}

fn skip_ack(c: &mut Cursor<'_>, ecn: bool) -> Option<()> {
    c.varint()?; // largest acknowledged
    c.varint()?; // delay
    let ranges = c.varint()?;
    c.varint()?; // first range
                 // Each range is at least two bytes, so a count beyond the rest is a lie.
    if ranges > (c.buf.len() - c.pos) as u64 {
        return None;
    }
    for _ in 0..ranges {
        c.varint()?;
        c.varint()?;
    }
    if ecn {
        c.varint()?;
        c.varint()?;
        c.varint()?;
    }
    Some(())
}

/// Handshake message type `client_hello`.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// The SNI of a ClientHello body (after the 4-byte handshake header).
fn client_hello_sni(body: &[u8]) -> Option<String> {
    crate::inbound::clienthello::sni_of_body(body)
}

/// Bounds-checked reads; every method returns `None` past the end.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    /// A QUIC variable-length integer (RFC 9000 §16).
    fn varint(&mut self) -> Option<u64> {
        let first = self.u8()?;
        let len = 1usize << (first >> 6);
        let mut v = u64::from(first & 0x3f);
        for &b in self.take(len - 1)? {
            v = v << 8 | u64::from(b);
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9001 Appendix A.2: the client Initial (1200 bytes, DCID
    /// 0x8394c8f03e515708, packet number 2, SNI example.com).
    const RFC9001_A2: &str = concat!(
        "c000000001088394c8f03e5157080000449e7b9aec34d1b1c98dd7689fb8ec11",
        "d242b123dc9bd8bab936b47d92ec356c0bab7df5976d27cd449f63300099f399",
        "1c260ec4c60d17b31f8429157bb35a1282a643a8d2262cad67500cadb8e7378c",
        "8eb7539ec4d4905fed1bee1fc8aafba17c750e2c7ace01e6005f80fcb7df6212",
        "30c83711b39343fa028cea7f7fb5ff89eac2308249a02252155e2347b63d58c5",
        "457afd84d05dfffdb20392844ae812154682e9cf012f9021a6f0be17ddd0c208",
        "4dce25ff9b06cde535d0f920a2db1bf362c23e596d11a4f5a6cf3948838a3aec",
        "4e15daf8500a6ef69ec4e3feb6b1d98e610ac8b7ec3faf6ad760b7bad1db4ba3",
        "485e8a94dc250ae3fdb41ed15fb6a8e5eba0fc3dd60bc8e30c5c4287e53805db",
        "059ae0648db2f64264ed5e39be2e20d82df566da8dd5998ccabdae053060ae6c",
        "7b4378e846d29f37ed7b4ea9ec5d82e7961b7f25a9323851f681d582363aa5f8",
        "9937f5a67258bf63ad6f1a0b1d96dbd4faddfcefc5266ba6611722395c906556",
        "be52afe3f565636ad1b17d508b73d8743eeb524be22b3dcbc2c7468d54119c74",
        "68449a13d8e3b95811a198f3491de3e7fe942b330407abf82a4ed7c1b311663a",
        "c69890f4157015853d91e923037c227a33cdd5ec281ca3f79c44546b9d90ca00",
        "f064c99e3dd97911d39fe9c5d0b23a229a234cb36186c4819e8b9c5927726632",
        "291d6a418211cc2962e20fe47feb3edf330f2c603a9d48c0fcb5699dbfe58964",
        "25c5bac4aee82e57a85aaf4e2513e4f05796b07ba2ee47d80506f8d2c25e50fd",
        "14de71e6c418559302f939b0e1abd576f279c4b2e0feb85c1f28ff18f58891ff",
        "ef132eef2fa09346aee33c28eb130ff28f5b766953334113211996d20011a198",
        "e3fc433f9f2541010ae17c1bf202580f6047472fb36857fe843b19f5984009dd",
        "c324044e847a4f4a0ab34f719595de37252d6235365e9b84392b061085349d73",
        "203a4a13e96f5432ec0fd4a1ee65accdd5e3904df54c1da510b0ff20dcc0c77f",
        "cb2c0e0eb605cb0504db87632cf3d8b4dae6e705769d1de354270123cb11450e",
        "fc60ac47683d7b8d0f811365565fd98c4c8eb936bcab8d069fc33bd801b03ade",
        "a2e1fbc5aa463d08ca19896d2bf59a071b851e6c239052172f296bfb5e724047",
        "90a2181014f3b94a4e97d117b438130368cc39dbb2d198065ae3986547926cd2",
        "162f40a29f0c3c8745c0f50fba3852e566d44575c29d39a03f0cda721984b6f4",
        "40591f355e12d439ff150aab7613499dbd49adabc8676eef023b15b65bfc5ca0",
        "6948109f23f350db82123535eb8a7433bdabcb909271a6ecbcb58b936a88cd4e",
        "8f2e6ff5800175f113253d8fa9ca8885c2f552e657dc603f252e1a8e308f76f0",
        "be79e2fb8f5d5fbbe2e30ecadd220723c8c0aea8078cdfcb3868263ff8f09400",
        "54da48781893a7e49ad5aff4af300cd804a6b6279ab3ff3afb64491c85194aab",
        "760d58a606654f9f4400e8b38591356fbf6425aca26dc85244259ff2b19c41b9",
        "f96f3ca9ec1dde434da7d2d392b905ddf3d1f9af93d1af5950bd493f5aa731b4",
        "056df31bd267b6b90a079831aaf579be0a39013137aac6d404f518cfd4684064",
        "7e78bfe706ca4cf5e9c5453e9f7cfd2b8b4c8d169a44e55c88d4a9a7f9474241",
        "e221af44860018ab0856972e194cd934",
    );
    const A2_DCID: [u8; 8] = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn peer(n: u16) -> SocketAddr {
        SocketAddr::from(([203, 0, 113, 10], 40000 + n))
    }

    fn varint(v: u64) -> Vec<u8> {
        assert!(v < 1 << 14);
        if v < 1 << 6 {
            vec![v as u8]
        } else {
            (0x4000 | v as u16).to_be_bytes().to_vec()
        }
    }

    fn crypto_frame(offset: u64, data: &[u8]) -> Vec<u8> {
        let mut f = vec![0x06];
        f.extend(varint(offset));
        f.extend(varint(data.len() as u64));
        f.extend(data);
        f
    }

    /// A client Initial as a client would protect it (the inverse of
    /// [`open_initial`]), padded to 1200 bytes; 2-byte packet number.
    fn seal_initial(version: u32, dcid: &[u8], pn: u16, frames: &[u8]) -> Vec<u8> {
        let keys = initial_keys(version, dcid, rustls::Side::Client)
            .unwrap()
            .local;
        let kind = if version == VERSION_2 { 1 } else { 0 };
        let mut header = vec![0xc0 | kind << 4 | 0x01];
        header.extend(version.to_be_bytes());
        header.push(dcid.len() as u8);
        header.extend(dcid);
        header.push(0); // no SCID
        header.push(0); // no token
        let header_len = header.len() + 2 + 2;
        let mut payload = frames.to_vec();
        payload.resize(1200 - header_len - 16, 0);
        header.extend((0x4000 | (2 + payload.len() + 16) as u16).to_be_bytes());
        let pn_offset = header.len();
        header.extend(pn.to_be_bytes());
        let tag = keys
            .packet
            .encrypt_in_place(u64::from(pn), &header, &mut payload)
            .unwrap();
        payload.extend_from_slice(tag.as_ref());
        let mut packet = header;
        packet.extend(payload);
        let (head, rest) = packet.split_at_mut(pn_offset);
        let (pn_field, after) = rest.split_at_mut(2);
        keys.header
            .encrypt_in_place(&after[2..18], &mut head[0], pn_field)
            .unwrap();
        packet
    }

    /// A minimal ClientHello handshake message naming `sni`.
    fn client_hello(sni: &str) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let name = sni.as_bytes();
        let mut sni_ext = Vec::new();
        sni_ext.extend(((name.len() + 3) as u16).to_be_bytes());
        sni_ext.push(0);
        sni_ext.extend((name.len() as u16).to_be_bytes());
        sni_ext.extend(name);
        let mut exts = vec![0xff, 0x01, 0, 1, 0]; // another extension first
        exts.extend([0, 0]);
        exts.extend((sni_ext.len() as u16).to_be_bytes());
        exts.extend(sni_ext);
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut msg = vec![HANDSHAKE_CLIENT_HELLO];
        msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        msg
    }

    #[test]
    fn client_initial_keys_match_rfc9001_appendix_a1() {
        // A packet protected with RFC 9001 A.1's client key, IV and header
        // protection key opens with the keys rustls derives for its DCID.
        use aws_lc_rs::aead::quic::{HeaderProtectionKey, AES_128};
        use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
        let key = unhex("1f369613dd76d5467730efcbe3b1a22d");
        let iv = unhex("fa044b2f42a3fd3b46fb255c");
        let hp = unhex("9f50449e04a0e810283a1e9933adedd2");
        let frames = crypto_frame(0, b"hello");
        let mut header = vec![0xc1];
        header.extend(VERSION_1.to_be_bytes());
        header.push(A2_DCID.len() as u8);
        header.extend(A2_DCID);
        header.extend([0, 0]); // no SCID, no token
        let mut payload = frames.clone();
        payload.resize(1200 - (header.len() + 4) - 16, 0);
        header.extend((0x4000 | (2 + payload.len() + 16) as u16).to_be_bytes());
        let pn_offset = header.len();
        header.extend(2u16.to_be_bytes());
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&iv);
        nonce[11] ^= 2;
        let sealer = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).unwrap());
        sealer
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&header),
                &mut payload,
            )
            .unwrap();
        let mut packet = header;
        packet.extend(payload);
        let mask = HeaderProtectionKey::new(&AES_128, &hp)
            .unwrap()
            .new_mask(&packet[pn_offset + 4..pn_offset + 20])
            .unwrap();
        packet[0] ^= mask[0] & 0x0f;
        packet[pn_offset] ^= mask[1];
        packet[pn_offset + 1] ^= mask[2];
        let plain = open_initial(VERSION_1, &packet, &A2_DCID, pn_offset).unwrap();
        assert!(plain.starts_with(&frames));
    }

    #[test]
    fn the_rfc9001_a2_client_initial_decrypts_to_its_client_hello() {
        let packet = unhex(RFC9001_A2);
        assert_eq!(packet.len(), 1200);
        let parsed = parse_datagram(&packet);
        assert_eq!(parsed.dcid, A2_DCID);
        assert_eq!(parsed.crypto.len(), 1, "one CRYPTO frame");
        let (offset, hello) = &parsed.crypto[0];
        assert_eq!(*offset, 0);
        // RFC 9001 A.2: a 241-byte CRYPTO payload, a ClientHello whose
        // random starts ebf8fa56.
        assert_eq!(hello.len(), 241);
        assert_eq!(&hello[..4], &[0x01, 0x00, 0x00, 0xed]);
        assert_eq!(&hello[6..10], &unhex("ebf8fa56")[..]);
        assert_eq!(
            client_hello_sni(&hello[4..]).as_deref(),
            Some("example.com")
        );
    }

    #[test]
    fn retransmitted_initials_make_one_entry_with_their_count_and_sni() {
        let packet = unhex(RFC9001_A2);
        let mut sink = Sink::new(MAX_FLOWS);
        let t0 = Instant::now();
        for i in 0..3 {
            let closed = sink.datagram(peer(1), &packet, t0 + Duration::from_millis(300 * i));
            assert!(closed.is_empty());
        }
        assert_eq!(sink.len(), 1);
        assert!(
            sink.expire(t0 + Duration::from_millis(900)).is_empty(),
            "still retransmitting"
        );
        let entries = sink.expire(t0 + Duration::from_millis(600) + IDLE);
        assert_eq!(
            entries,
            [Entry::Quic {
                host: Some("example.com".into()),
                dst: "203.0.113.10:443".into(),
                attempts: 3,
            }]
        );
        assert!(sink.is_empty());
    }

    #[test]
    fn a_client_hello_split_across_datagrams_out_of_order_is_reassembled() {
        let hello = client_hello("API.Stripe.com.");
        let dcid = [9u8; 8];
        let (a, b) = hello.split_at(20);
        // The second half arrives first, in a packet with a PING and an ACK
        // before it; the first half follows in a second datagram.
        let mut frames = vec![0x01, 0x02, 0x00, 0x00, 0x00, 0x00];
        frames.extend(crypto_frame(20, b));
        let first = seal_initial(VERSION_1, &dcid, 0, &frames);
        let second = seal_initial(VERSION_1, &dcid, 1, &crypto_frame(0, a));
        let mut sink = Sink::new(MAX_FLOWS);
        let now = Instant::now();
        sink.datagram(peer(2), &first, now);
        sink.datagram(peer(2), &second, now);
        assert_eq!(
            sink.drain(),
            [Entry::Quic {
                host: Some("api.stripe.com".into()),
                dst: "203.0.113.10:443".into(),
                attempts: 2,
            }]
        );
    }

    #[test]
    fn quic_version_2_initials_are_read_too() {
        let dcid = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let packet = seal_initial(
            VERSION_2,
            &dcid,
            0,
            &crypto_frame(0, &client_hello("a.test")),
        );
        // The version picks the salt and labels: v1 keys do not open it.
        let pn_offset = 1 + 4 + 1 + dcid.len() + 1 + 1 + 2;
        assert!(open_initial(VERSION_2, &packet, &dcid, pn_offset).is_some());
        assert!(open_initial(VERSION_1, &packet, &dcid, pn_offset).is_none());
        let parsed = parse_datagram(&packet);
        assert_eq!(parsed.crypto.len(), 1);
        assert_eq!(
            client_hello_sni(&parsed.crypto[0].1[4..]).as_deref(),
            Some("a.test")
        );
    }

    #[test]
    fn truncated_corrupted_and_garbage_datagrams_are_counted_without_a_host() {
        let packet = unhex(RFC9001_A2);
        let mut sink = Sink::new(MAX_FLOWS);
        let now = Instant::now();
        // Every truncation of a real Initial, then a flipped byte at each of
        // its first 64 positions (header and sample): none may panic or be
        // believed.
        for len in 0..packet.len() {
            sink.datagram(peer(3), &packet[..len], now);
        }
        for i in 0..64 {
            let mut bad = packet.clone();
            bad[i] ^= 0x5a;
            sink.datagram(peer(4), &bad, now);
        }
        // Deterministic pseudo-random garbage, half of it long-header-looking.
        let mut x: u32 = 0x1234_5678;
        for n in 0..500usize {
            let mut data: Vec<u8> = (0..n % 1300)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            if n % 2 == 0 && data.len() > 6 {
                data[0] = 0xc0;
                data[1..5].copy_from_slice(&VERSION_1.to_be_bytes());
                data[5] = 8;
            }
            sink.datagram(peer(5), &data, now);
        }
        let entries = sink.drain();
        let total: u64 = entries
            .iter()
            .map(|e| match e {
                Entry::Quic { host, attempts, .. } => {
                    assert_eq!(host, &None, "nothing decrypts: {e:?}");
                    *attempts
                }
                other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(
            total,
            (packet.len() + 64 + 500) as u64,
            "every datagram counted"
        );
    }

    #[test]
    fn the_flow_table_is_bounded_and_evicts_the_least_recently_seen() {
        let packet = unhex(RFC9001_A2);
        let mut sink = Sink::new(4);
        let t0 = Instant::now();
        let mut closed = Vec::new();
        for i in 0..10u16 {
            let at = t0 + Duration::from_millis(u64::from(i));
            closed.extend(sink.datagram(peer(100 + i), &packet, at));
            assert!(sink.len() <= 4);
        }
        assert_eq!(closed.len(), 6);
        for e in &closed {
            assert_eq!(
                e,
                &Entry::Quic {
                    host: Some("example.com".into()),
                    dst: "203.0.113.10:443".into(),
                    attempts: 1,
                }
            );
        }
        assert_eq!(sink.drain().len(), 4);
    }

    #[test]
    fn an_attempt_that_keeps_retransmitting_is_written_after_max_age() {
        let packet = unhex(RFC9001_A2);
        let mut sink = Sink::new(MAX_FLOWS);
        let t0 = Instant::now();
        let mut closed = Vec::new();
        for i in 0..=12u64 {
            closed.extend(sink.datagram(peer(6), &packet, t0 + Duration::from_secs(i)));
        }
        assert_eq!(closed.len(), 1, "the first ten seconds are one entry");
        assert!(matches!(closed[0], Entry::Quic { attempts: 10, .. }));
        assert!(matches!(
            sink.drain()[..],
            [Entry::Quic { attempts: 3, .. }]
        ));
    }

    #[tokio::test]
    async fn the_sink_never_answers_and_ignores_datagrams_not_from_the_redirect() {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let recorder = Arc::new(crate::request::recorder::MemoryRecorder::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(socket, recorder.clone(), async move {
            let _ = stop_rx.await;
        }));
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.send_to(&unhex(RFC9001_A2), addr).await.unwrap();
        // Nothing comes back (a bounded wait, not a timed assertion on our speed).
        let mut buf = [0u8; 64];
        let answered =
            tokio::time::timeout(Duration::from_millis(300), client.recv_from(&mut buf)).await;
        assert!(answered.is_err(), "the sink answered");
        stop_tx.send(()).unwrap();
        task.await.unwrap().unwrap();
        assert!(
            recorder.entries().is_empty(),
            "a loopback datagram is not an attempt"
        );
    }
}
