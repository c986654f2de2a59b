//! The ledger reader (veris_receipt::ledger::read_bytes): any bytes read as
//! a ledger file. Never a panic; every complete line is either a line read
//! or a problem; the tail after the last newline is never read as a line.
//! Each complete line reads to what serde_json reads it to: the reader's
//! fast path for request lines in the writer's form must agree with serde.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veris_receipt::ledger::read_bytes;
use veris_receipt::Line;

fuzz_target!(|data: &[u8]| {
    let read = read_bytes(data);
    let complete = data.iter().filter(|&&b| b == b'\n').count();
    assert!(read.lines.len() <= complete);
    let good = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    assert_eq!(read.good_len, good as u64);
    let mut lines = read.lines.iter();
    for raw in data[..good]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
    {
        if raw.len() > veris_receipt::ledger::MAX_LINE {
            continue;
        }
        if let Ok(want) = serde_json::from_slice::<Line>(raw) {
            assert_eq!(lines.next(), Some(&want));
        }
    }
    assert_eq!(lines.next(), None);
});
