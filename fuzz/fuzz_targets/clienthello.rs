//! The transparent tier's ClientHello reader (proxy/src/clienthello.rs):
//! the bytes arrive cut into reads at places the input chooses. Whatever the
//! cut, the answer must be the same as for the whole prefix at once, never a
//! panic, and a hello's `raw` must be exactly the bytes fed.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_proxy::inbound::clienthello::{Parser, MAX_CLIENT_HELLO};

fuzz_target!(|data: &[u8]| {
    let pieces = common::chunks(data);
    let mut split = Parser::new(MAX_CLIENT_HELLO);
    let mut fed = Vec::new();
    let mut outcome = None;
    for piece in pieces {
        fed.extend_from_slice(piece);
        match split.push(piece) {
            Ok(None) => continue,
            other => {
                outcome = Some(other);
                break;
            }
        }
    }
    let Some(outcome) = outcome else { return };
    // The same bytes in one push decide the same way.
    let whole = Parser::new(MAX_CLIENT_HELLO).push(&fed);
    match (&outcome, &whole) {
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!(a, b);
            assert_eq!(a.raw, fed);
            if let Some(sni) = &a.sni {
                assert!(!sni.is_empty() && !sni.ends_with('.'));
                assert!(sni
                    .bytes()
                    .all(|b| !b.is_ascii_uppercase() && b.is_ascii_graphic()));
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("split {outcome:?} vs whole {whole:?}"),
    }
});
