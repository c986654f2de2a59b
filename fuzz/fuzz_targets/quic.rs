//! The QUIC sink (proxy/src/quic.rs): a sequence of datagrams (each after a
//! two-byte length) from a few
//! peers into a small table. No panic, the table stays within its bound, and
//! every datagram is counted once in the entries written.
#![no_main]

#[path = "common.rs"]
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use veris_proxy::inbound::quic::Sink;
use veris_receipt::Entry;

fuzz_target!(|data: &[u8]| {
    let mut sink = Sink::new(4);
    let start = Instant::now();
    let mut entries = Vec::new();
    let datagrams = common::chunks16(data);
    for (i, d) in datagrams.iter().enumerate() {
        // The peer (original destination) and the clock come from the datagram.
        let port = 40000 + u16::from(d.first().copied().unwrap_or(0) % 3);
        let peer = SocketAddr::from(([203, 0, 113, 10], port));
        let now = start + Duration::from_millis(500 * i as u64);
        entries.extend(sink.datagram(peer, d, now));
        assert!(sink.len() <= 4);
        if i % 5 == 4 {
            entries.extend(sink.expire(now));
        }
    }
    entries.extend(sink.drain());
    assert!(sink.is_empty());
    let counted: u64 = entries
        .iter()
        .map(|e| match e {
            Entry::Quic { attempts, .. } => u64::from(*attempts),
            _ => 0,
        })
        .sum();
    assert_eq!(counted, datagrams.len() as u64);
});
