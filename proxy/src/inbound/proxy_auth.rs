//! HTTP proxy authentication for the gateway tier (G1): a sandbox platform
//! that forwards through an HTTP proxy (`CONNECT`, or absolute-form plain
//! HTTP) names the sandbox with `Proxy-Authorization: Basic` (RFC 7617),
//! the same username and password a SOCKS5 client sends
//! ([`super::socks5::Credentials`], with the same limits). This module reads
//! that header strictly and writes the 407 challenge; checking the
//! credentials is the caller's.
//!
//! Strict means: exactly one `Proxy-Authorization` header; the scheme
//! `Basic` (any case) and one token of standard base64 with canonical
//! padding, nothing else; the decoded bytes split at the first `:` into
//! username and password, each 1 to 255 bytes of UTF-8. The header is
//! bounded before it is decoded.

use base64::Engine as _;
use http::header::{PROXY_AUTHENTICATE, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::socks5::{Credentials, MAX_CREDENTIAL};

/// The realm a client is challenged with.
pub const REALM: &str = "veris gateway";

/// The longest base64 credentials token taken: username, `:` and
/// password at their limits, encoded.
const MAX_TOKEN: usize = (MAX_CREDENTIAL * 2 + 1).div_ceil(3) * 4;

/// Why a request carries no usable proxy credentials. Either way the
/// answer is [`challenge`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Proxy-Authorization` header.
    #[error("no Proxy-Authorization header: the client needs the sandbox's credentials in its proxy URL (http://USER:PASS@HOST:PORT)")]
    Missing,
    /// A header that is not one well-formed `Basic` credential.
    #[error("malformed Proxy-Authorization: {0}")]
    Malformed(&'static str),
}

/// The credentials of `Proxy-Authorization: Basic <base64(user:pass)>`.
pub fn basic_credentials(headers: &HeaderMap) -> Result<Credentials, AuthError> {
    let mut values = headers.get_all(PROXY_AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthError::Missing)?;
    if values.next().is_some() {
        return Err(AuthError::Malformed(
            "more than one Proxy-Authorization header",
        ));
    }
    parse(value)
}

fn parse(value: &HeaderValue) -> Result<Credentials, AuthError> {
    let malformed = AuthError::Malformed;
    let value = value.as_bytes().trim_ascii();
    let space = value
        .iter()
        .position(|&b| b == b' ')
        .ok_or(malformed("no credentials after the scheme"))?;
    let (scheme, token) = (&value[..space], value[space..].trim_ascii_start());
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err(malformed("the scheme is not Basic"));
    }
    if token.is_empty() {
        return Err(malformed("no credentials after the scheme"));
    }
    if token.len() > MAX_TOKEN {
        return Err(malformed(
            "the credentials are longer than 255-byte username and password",
        ));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| malformed("the credentials are not standard padded base64"))?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or(malformed("no ':' between username and password"))?;
    Credentials::new(&decoded[..colon], &decoded[colon + 1..]).map_err(malformed)
}

/// A 407 asking for credentials (`Proxy-Authenticate: Basic realm="veris
/// gateway"`) with `body`.
pub fn challenge<B>(body: B) -> Response<B> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::PROXY_AUTHENTICATION_REQUIRED;
    response.headers_mut().insert(
        PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"veris gateway\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(PROXY_AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    fn basic(raw: &[u8]) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    #[test]
    fn credentials_round_trip_split_at_the_first_colon() {
        for (raw, user, pass) in [
            (&b"sbx-1:s3cret"[..], "sbx-1", "s3cret"),
            (b"u:p:with:colons", "u", "p:with:colons"),
            ("ü:pässword".as_bytes(), "ü", "pässword"),
        ] {
            let c = basic_credentials(&headers(&[basic(raw).as_bytes()])).unwrap();
            assert_eq!((c.username.as_str(), c.password.as_str()), (user, pass));
        }
        // Scheme in any case, spaces around.
        let token = base64::engine::general_purpose::STANDARD.encode("u:p");
        for v in [
            format!("basic {token}"),
            format!("BASIC   {token}"),
            format!(" Basic {token} "),
        ] {
            let c = basic_credentials(&headers(&[v.as_bytes()])).unwrap();
            assert_eq!(c.username, "u");
        }
        // The limits at their edge.
        let long = "a".repeat(255);
        let c = basic_credentials(&headers(&[
            basic(format!("{long}:{long}").as_bytes()).as_bytes()
        ]))
        .unwrap();
        assert_eq!((c.username.len(), c.password.len()), (255, 255));
    }

    #[test]
    fn each_malformed_header_says_why() {
        assert_eq!(
            basic_credentials(&HeaderMap::new()),
            Err(AuthError::Missing)
        );
        let ok = basic(b"u:p");
        let long = "a".repeat(256);
        for (value, why) in [
            (ok.clone().into_bytes(), "the credentials"),
            (b"Basic".to_vec(), "no credentials after the scheme"),
            (b"Basic ".to_vec(), "no credentials after the scheme"),
            (b"Bearer dTpw".to_vec(), "the scheme is not Basic"),
            (b"Digest username=u".to_vec(), "the scheme is not Basic"),
            (
                b"Basic dTpwcQ".to_vec(),
                "the credentials are not standard padded base64",
            ),
            (
                b"Basic dTp=".to_vec(),
                "the credentials are not standard padded base64",
            ),
            (
                b"Basic dTpw dTpw".to_vec(),
                "the credentials are not standard padded base64",
            ),
            (
                b"Basic dT-w".to_vec(),
                "the credentials are not standard padded base64",
            ),
            (
                basic(b"nocolon").into_bytes(),
                "no ':' between username and password",
            ),
            (basic(b":p").into_bytes(), "the username is empty"),
            (basic(b"u:").into_bytes(), "the password is empty"),
            (basic(b"\xff:p").into_bytes(), "the username is not UTF-8"),
            (
                basic(b"u\r\n:p").into_bytes(),
                "the username has a control character",
            ),
            (basic(b"u:\xc3").into_bytes(), "the password is not UTF-8"),
            (
                basic(format!("{long}:p").as_bytes()).into_bytes(),
                "the username is over 255 bytes",
            ),
            (
                basic(format!("u:{long}").as_bytes()).into_bytes(),
                "the password is over 255 bytes",
            ),
            (
                basic("a".repeat(601).as_bytes()).into_bytes(),
                "the credentials are longer than 255-byte username and password",
            ),
        ] {
            if why == "the credentials" {
                // Twice is refused even when each is good.
                let e = basic_credentials(&headers(&[&value, &value])).unwrap_err();
                assert_eq!(
                    e,
                    AuthError::Malformed("more than one Proxy-Authorization header")
                );
                continue;
            }
            let e = basic_credentials(&headers(&[&value])).unwrap_err();
            assert_eq!(
                e,
                AuthError::Malformed(why),
                "{:?}",
                String::from_utf8_lossy(&value)
            );
        }
    }

    #[test]
    fn the_challenge_is_a_407_naming_the_basic_realm() {
        let r = challenge(());
        assert_eq!(r.status(), 407);
        assert_eq!(
            r.headers()[PROXY_AUTHENTICATE],
            format!("Basic realm=\"{REALM}\"")
        );
    }
}
