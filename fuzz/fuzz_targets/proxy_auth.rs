//! The gateway's `Proxy-Authorization: Basic` reader
//! (proxy/src/inbound/proxy_auth.rs). The input is up to three header
//! values separated by '\n'. Besides no panic: credentials taken are 1 to
//! 255 bytes each, the username has no ':' and no control character, and
//! they were sent in the one canonical encoding (the token is exactly the
//! base64 of `username:password`), so two different headers never give
//! the same credentials.
#![no_main]

use base64::Engine as _;
use http::header::PROXY_AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use veris_proxy::inbound::proxy_auth::basic_credentials;

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for value in data.split(|&b| b == b'\n').take(3) {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(PROXY_AUTHORIZATION, v);
        }
    }
    let Ok(c) = basic_credentials(&headers) else {
        return;
    };
    assert!((1..=255).contains(&c.username.len()));
    assert!((1..=255).contains(&c.password.len()));
    assert!(!c.username.contains(':'));
    assert!(!c.username.chars().any(char::is_control));
    let value = headers[PROXY_AUTHORIZATION].as_bytes().trim_ascii();
    let token =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
    assert!(value.len() > 6 && value[..5].eq_ignore_ascii_case(b"basic"));
    assert_eq!(value[5..].trim_ascii_start(), token.as_bytes());
});
