//! The ledger reader (veris_receipt::ledger::read_bytes): any bytes read as
//! a ledger file. Never a panic; every complete line is either a line read
//! or a problem; the tail after the last newline is never read as a line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veris_receipt::ledger::read_bytes;

fuzz_target!(|data: &[u8]| {
    let read = read_bytes(data);
    let complete = data.iter().filter(|&&b| b == b'\n').count();
    assert!(read.lines.len() <= complete);
    let good = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    assert_eq!(read.good_len, good as u64);
});
