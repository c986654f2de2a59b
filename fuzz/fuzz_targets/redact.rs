//! Redaction (receipt/src/redact.rs): never a panic, idempotent, and a
//! secret placed in the input never comes out. The input is free text
//! around which a secret is planted three ways: a Stripe live key in prose,
//! an `api_key=` query parameter, and an Authorization header.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_receipt::redact;

fuzz_target!(|data: &[u8]| {
    let (text, seed) = common::split2(data, 0);
    let text = String::from_utf8_lossy(text);
    // Never a panic; and idempotent, as the module promises.
    for f in [redact::text, redact::query, redact::url] {
        let once = f(&text);
        assert_eq!(f(&once), once, "not idempotent on {text:?}");
    }
    let (name, value) = text.split_once(':').unwrap_or((&text, ""));
    let once = redact::header_value(name, value);
    assert_eq!(redact::header_value(name, &once), once);

    let key = common::secret(seed);
    if text.contains(&key[..8]) {
        // The fuzzer copied the key into the text around it: not a plant.
        return;
    }
    let live = format!("sk_live_{key}");
    let prose = format!("{text} {live} {text}");
    assert!(!redact::text(&prose).contains(&key), "{prose:?}");
    assert!(!redact::url(&format!("/v1/x?{text}&api_key={key}&{text}")).contains(&key));
    assert_eq!(
        redact::header_value("Authorization", &format!("Bearer {key}")),
        redact::REDACTED
    );
});
