//! The transparent tier's first-bytes sniffer (proxy/src/sniff.rs). A
//! decision, once made for a prefix, must hold for every longer prefix
//! (`classify` says `None` only while more bytes could change it), and
//! `settle` agrees with any decision already made.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veris_proxy::inbound::sniff::{classify, settle, SNIFF_LIMIT};

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(SNIFF_LIMIT)];
    let full = classify(data);
    let settled = settle(data);
    if let Some(p) = full {
        assert_eq!(p, settled);
    }
    // A few prefixes, not all: each classify is linear in its input.
    let step = (data.len() / 16).max(1);
    for n in (0..data.len()).step_by(step) {
        if let Some(p) = classify(&data[..n]) {
            assert_eq!(Some(p), full, "prefix of {n} bytes decided {p:?}");
        }
    }
});
