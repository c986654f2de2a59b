//! The TUI's server-sent event reader (tui/src/admin.rs): a stream cut into
//! chunks anywhere gives the same events as the stream in one piece, and
//! what the parser holds stays bounded however long a line or event is.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_tui::admin::SseParser;

fuzz_target!(|data: &[u8]| {
    let pieces = common::chunks(data);
    let stream: Vec<u8> = pieces.concat();
    let limit = 64;
    let mut split = SseParser::with_limit(limit);
    let mut got = Vec::new();
    for p in &pieces {
        got.extend(split.feed(p));
        assert!(split.held() <= 2 * limit, "{}", split.held());
    }
    let mut whole = SseParser::with_limit(limit);
    let want = whole.feed(&stream);
    assert_eq!(got, want);
    assert_eq!(split.oversized(), whole.oversized());
});
