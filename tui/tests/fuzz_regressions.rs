//! Inputs the fuzz targets (fuzz/, see fuzz/README.md) found, replayed on
//! the path they broke, so the normal suite keeps them fixed.

use veris_tui::admin::SseParser;

/// sse, crash-a3f8eaf7: a `data:` line of invalid UTF-8 within the byte
/// limit decodes (lossily) to three times its length, so the event held
/// more than the limit. The limit is now measured after decoding.
#[test]
fn invalid_utf8_data_cannot_grow_an_event_past_the_limit() {
    let mut p = SseParser::with_limit(64);
    let mut stream = b"id: 1\ndata: {\"v\"e".to_vec();
    stream.extend([0xff; 41]);
    stream.extend(b"\n");
    assert!(p.feed(&stream).is_empty());
    assert!(p.held() <= 64, "held {}", p.held());
    let got = p.feed(b"\nid: 2\ndata: ok\n\n");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, "ok");
    assert_eq!(p.oversized(), 1);
}

/// Before any limit existed, a stream that never sent a newline was
/// buffered whole: 64 MiB in, 64 MiB held.
#[test]
fn a_line_that_never_ends_is_not_buffered_whole() {
    let mut p = SseParser::default();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..16 {
        p.feed(&chunk);
    }
    assert!(p.held() <= veris_tui::admin::MAX_EVENT, "held {}", p.held());
}
