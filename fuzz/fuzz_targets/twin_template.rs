//! The twin's templates (twin/src/template.rs): a fixture body template
//! (first line, JSON) compiled and rendered against a request body (the
//! rest, parsed as the twin parses bodies) and a query (after a NUL).
//! Compile errors are messages; rendering never panics.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_twin::fuzzing::{parse_body, render};

fuzz_target!(|data: &[u8]| {
    let (template, rest) = common::split2(data, b'\n');
    let (body, query) = common::split2(rest, 0);
    let Ok(template) = serde_json::from_slice::<serde_json::Value>(template) else {
        return;
    };
    let body = parse_body("", body).unwrap_or_default();
    match render(&template, &body, &String::from_utf8_lossy(query)) {
        Ok(v) => {
            let _ = v.to_string();
        }
        Err(msg) => assert!(!msg.is_empty()),
    }
});
