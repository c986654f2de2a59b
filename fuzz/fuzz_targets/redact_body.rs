//! Captured-body redaction (receipt/src/redact.rs `body`): never a panic on
//! any bytes, content type or cut; and a secret planted by name in a JSON
//! or form body never comes out, whole or cut at any length, whatever the
//! fuzzed text around it.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_receipt::redact::{self, BodyText};

const TYPES: &[&str] = &[
    "application/json",
    "application/vnd.api+json; charset=utf-8",
    "APPLICATION/JSON",
    "application/x-www-form-urlencoded",
    "text/plain",
    "application/xml",
    "application/octet-stream",
];

fn stored(ct: &str, bytes: &[u8], truncated: bool) -> Option<String> {
    match redact::body(Some(ct), bytes, truncated) {
        BodyText::Text(t) => Some(t),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let (text, seed) = common::split2(data, 0);
    // Any bytes, any type, cut or not: never a panic.
    for ct in TYPES {
        let _ = redact::body(Some(ct), text, false);
        let _ = redact::body(Some(ct), text, true);
    }
    let _ = redact::body(None, text, false);

    let key = common::secret(seed);
    let text = String::from_utf8_lossy(text);
    let note = text.replace(['&', '='], "");
    if text.contains(&key[3..11]) || note.contains(&key[3..11]) {
        // The fuzzer copied the key into the text around it: not a plant.
        return;
    }
    let quoted = serde_json::to_string(&text).unwrap_or_default();
    let json = format!(
        r#"{{"note":{quoted},"password":"{key}","nested":[{{"api_key":"{key}"}}],"client_secret":{{"v":"{key}"}}}}"#
    );
    let form = format!("note={note}&password={key}&card%5Bcvc%5D={key}");
    for (ct, body) in [
        ("application/json", &json),
        ("application/x-www-form-urlencoded", &form),
    ] {
        let bytes = body.as_bytes();
        // Whole, and cut at every length the fuzzer picks (a few per input).
        let cuts = seed
            .iter()
            .take(4)
            .map(|&b| bytes.len() * usize::from(b) / 255);
        for (cut, truncated) in std::iter::once((bytes.len(), false)).chain(cuts.map(|c| (c, true)))
        {
            if let Some(out) = stored(ct, &bytes[..cut], truncated) {
                // Four bytes of the key are enough to call it kept: the
                // random part is 21 characters long.
                assert!(!out.contains(&key[3..11]), "{ct} cut {cut}: {out:?}");
            }
        }
    }
});
