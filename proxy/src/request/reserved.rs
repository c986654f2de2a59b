//! Vendor paths the proxy answers itself instead of forwarding (DESIGN §7a.7).
//!
//! A twin serves its control surface right beside each service's vendor
//! surface: vendor traffic goes to `{base}/s/{sandbox}/{service}{path}`, the
//! request log to `{base}/s/{sandbox}/{service}/veris/requests`. So a vendor
//! path whose first segment is `veris` would reach the control surface, and a
//! path with dot-segments could be resolved out of the service's prefix (to
//! another service, or to the control surface) by the twin or by anything in
//! front of it. Neither is a vendor call; the proxy refuses both.
//!
//! The check is deliberately wider than what the built-in twin would resolve,
//! because an external twin may sit behind a server that decodes more: every
//! level of percent-encoding (`%2e`, `%252e`), encoded separators (`%2f`,
//! `%5c`), backslashes as separators, `;parameters` on a segment (`..;/`),
//! and merged slashes (`//veris`) count. Real vendor APIs use none of these in
//! a way that collides with `.`, `..` or `veris` segments.

/// What the proxy does with a vendor request's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathClass {
    /// An ordinary vendor path: forward it.
    Vendor,
    /// A `.` or `..` segment in any encoding, or an encoding nested too deep
    /// to judge: `400 veris_bad_path`.
    DotSegment,
    /// The twin's control surface (`/veris`, `/veris/…`, in any case or
    /// encoding): `404 veris_reserved_path`.
    Reserved,
}

/// Percent-decoding rounds looked through. A path still changing after this
/// many is nested deeper than any client encodes by accident.
const MAX_DECODE_ROUNDS: usize = 4;

/// Classifies the path of a request routed to a vendor service. Pure: the
/// same path always gets the same answer.
pub fn classify(path: &str) -> PathClass {
    let mut current = path.as_bytes().to_vec();
    let mut reserved = false;
    for _ in 0..MAX_DECODE_ROUNDS {
        if segments(&current).any(is_dot_segment) {
            return PathClass::DotSegment;
        }
        reserved |= segments(&current)
            .find(|s| !s.is_empty())
            .is_some_and(|s| s.eq_ignore_ascii_case(b"veris"));
        match percent_decode(&current) {
            Some(decoded) => current = decoded,
            None if reserved => return PathClass::Reserved,
            None => return PathClass::Vendor,
        }
    }
    // Deeper than any honest client encodes: refuse rather than guess what a
    // server that keeps decoding would make of it.
    PathClass::DotSegment
}

/// The segments of a path, each cut at its first `;` (path parameters, which
/// some servers drop before resolving) and trimmed of whitespace and NULs.
/// `\` separates like `/`, as it does on some servers.
fn segments(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/' || b == b'\\').map(|segment| {
        let end = segment
            .iter()
            .position(|&b| b == b';')
            .unwrap_or(segment.len());
        trim(&segment[..end])
    })
}

fn trim(mut s: &[u8]) -> &[u8] {
    let junk = |b: &u8| b.is_ascii_whitespace() || *b == 0;
    while let Some((first, rest)) = s.split_first() {
        if !junk(first) {
            break;
        }
        s = rest;
    }
    while let Some((last, rest)) = s.split_last() {
        if !junk(last) {
            break;
        }
        s = rest;
    }
    s
}

fn is_dot_segment(segment: &[u8]) -> bool {
    segment == b"." || segment == b".."
}

/// One round of `%XX` decoding; `None` when there was nothing to decode.
/// Works on bytes: what matters here is ASCII, and a lossy UTF-8 conversion
/// must not stand between an escape and the byte it hides.
pub(crate) fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut changed = false;
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(hi), Some(lo)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push((hi << 4) | lo);
                changed = true;
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_vendor_paths_are_forwarded() {
        for path in [
            "/",
            "",
            "*",
            "/v1/charges",
            "/v1/charges/ch_123",
            "/calendar/v3/calendars/primary/events",
            "/v1/customers/cus_1/sources",
            "/v1/files/a.b/c..d/...",
            "/v1/.well-known/x",
            "/v1/..a/b",
            "/v1/a%20b",
            "/v1/veris",
            "/v1/veris/requests",
            "/verisign/x",
            "/veris-like",
            "/v1/%2e%2efoo",
            "/drive/v3/files/name%25with%25percents",
            "/v1/charges%3Fa%3Db",
            "/v1/x%ZZ/..%",
            "/100%",
        ] {
            assert_eq!(classify(path), PathClass::Vendor, "{path:?}");
        }
    }

    #[test]
    fn dot_segments_in_any_encoding_are_bad_paths() {
        for path in [
            "/..",
            "/.",
            "/../x",
            "/./x",
            "/v1/../veris/requests",
            "/v1/./charges",
            "/v1/charges/..",
            "/v1/charges/.",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/%2e%2E/x",
            "/.%2e/x",
            "/%2e./x",
            "/%2e/x",
            "/v1%2f..%2fveris",
            "/v1%2F%2e%2e%2Fveris%2Frequests",
            "/v1\\..\\veris",
            "/v1%5c..%5cveris",
            "/..;/veris/requests",
            "/v1/..;jsessionid=1/x",
            "/%252e%252e/x",
            "/%25252e%25252e/x",
            "/v1/%00../x",
            "/v1/..%20/x",
            "//../x",
            // Deeper than any client encodes by accident.
            "/%2525252525252e",
        ] {
            assert_eq!(classify(path), PathClass::DotSegment, "{path:?}");
        }
    }

    #[test]
    fn the_control_surface_is_reserved_in_any_case_or_encoding() {
        for path in [
            "/veris",
            "/veris/",
            "/veris/health",
            "/veris/requests?limit=1",
            "/VERIS/requests",
            "/Veris/health",
            "/%76eris/health",
            "/%56%45%52%49%53/health",
            "/%2576eris/health",
            "/veris%2frequests",
            "/veris%2Frequests",
            "//veris/requests",
            "/%2fveris/requests",
            "///veris",
            "\\veris\\requests",
            "/veris;x=1/requests",
            "/veris%20/requests",
            "/%00veris/health",
        ] {
            assert_eq!(classify(path), PathClass::Reserved, "{path:?}");
        }
    }

    #[test]
    fn a_dot_segment_wins_over_a_reserved_first_segment() {
        assert_eq!(classify("/veris/../v1/charges"), PathClass::DotSegment);
        assert_eq!(classify("/veris/%2e%2e/x"), PathClass::DotSegment);
    }

    #[test]
    fn decoding_is_bytewise_and_stops_when_nothing_changes() {
        assert_eq!(percent_decode(b"/a%2Fb%zz%4"), Some(b"/a/b%zz%4".to_vec()));
        assert_eq!(percent_decode(b"/plain"), None);
        assert_eq!(percent_decode(b"/%ff"), Some(vec![b'/', 0xff]));
        assert_eq!(classify("/%ff%fe/x"), PathClass::Vendor);
    }
}
