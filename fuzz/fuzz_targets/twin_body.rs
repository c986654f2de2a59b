//! The twin's request body parser (twin/src/twin.rs `parse_body`): JSON or a
//! Stripe-style form, chosen by the content type (first line of the input).
//! Never a panic; what parses stays shallow enough to render and drop; what
//! does not is a message for a 400.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_twin::fuzzing::parse_body;

fuzz_target!(|data: &[u8]| {
    let (ctype, body) = common::split2(data, b'\n');
    let ctype = String::from_utf8_lossy(ctype);
    match parse_body(&ctype, body) {
        Ok(value) => {
            // serde_json refuses more than 128 levels; forms stop at 32.
            assert!(
                common::depth(&value) <= 130,
                "depth {}",
                common::depth(&value)
            );
            let _ = value.to_string();
        }
        Err(msg) => assert!(!msg.is_empty()),
    }
});
