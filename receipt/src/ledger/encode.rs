//! The writer's encoding of a ledger line: the bytes serde_json writes for
//! a [`Line`] (its `Serialize` is in the `wire` module), without serde's
//! per-field machinery on the hot path.
//!
//! A line is encoded in two parts. [`Fields`] is the entry's part,
//! `"kind":"…",<fields>`, made where the entry is queued (on the caller's
//! thread, right after redaction); the writer thread then puts the line
//! around it: `{"v":…,"seq":…,"ts":"…",` + fields + `,"prev":"…"}`.
//! `request` entries, nearly every line of a busy ledger, are written by
//! hand here; every other kind goes through serde. The two must agree byte
//! for byte (the ledger format is versioned and hash-chained): the tests
//! below compare them over hostile entries.

use crate::entry::RequestLine;
use crate::entry::{Entry, ListenerTier};

/// Appends the entry's part of its line, `"kind":"…",<fields>`, exactly
/// as serde_json writes it inside a [`crate::entry::Line`]. The entry is
/// taken as is: the caller redacts it first where it came from traffic.
pub(super) fn fields(out: &mut Vec<u8>, entry: &Entry) -> Result<(), serde_json::Error> {
    match entry {
        Entry::Request(_) => {
            request(out, entry);
            Ok(())
        }
        _ => other(out, entry),
    }
}

/// Appends the whole line (no `\n`) to `buf`.
pub(super) fn line(buf: &mut Vec<u8>, v: u32, seq: u64, ts: &str, fields: &[u8], prev: &str) {
    head(buf, v, seq, ts);
    buf.extend_from_slice(fields);
    tail(buf, prev);
}

/// The line up to its entry's fields: `{"v":…,"seq":…,"ts":"…",`.
pub(super) fn head(buf: &mut Vec<u8>, v: u32, seq: u64, ts: &str) {
    let mut n = itoa::Buffer::new();
    buf.extend_from_slice(b"{\"v\":");
    buf.extend_from_slice(n.format(v).as_bytes());
    buf.extend_from_slice(b",\"seq\":");
    buf.extend_from_slice(n.format(seq).as_bytes());
    buf.extend_from_slice(b",\"ts\":");
    string(buf, ts);
    buf.push(b',');
}

/// The line after its entry's fields: `,"prev":"…"}`.
pub(super) fn tail(buf: &mut Vec<u8>, prev: &str) {
    buf.extend_from_slice(b",\"prev\":");
    string(buf, prev);
    buf.push(b'}');
}

/// Any kind, through serde: the entry on its own serializes externally
/// tagged, `{"<kind>":{<fields>}}`, and its fields are the same bytes the
/// line's serializer writes after `kind`.
fn other(out: &mut Vec<u8>, entry: &Entry) -> Result<(), serde_json::Error> {
    let tagged = serde_json::to_vec(entry)?;
    let kind = entry.kind();
    let open = kind.len() + 5; // {"<kind>":{
    let inner = tagged
        .get(open..tagged.len().saturating_sub(2))
        .filter(|_| tagged.ends_with(b"}}"))
        .ok_or_else(|| {
            <serde_json::Error as serde::ser::Error>::custom(
                "an entry must be a struct variant or hold a struct",
            )
        })?;
    out.extend_from_slice(b"\"kind\":");
    string(out, kind);
    if !inner.is_empty() {
        out.push(b',');
        out.extend_from_slice(inner);
    }
    Ok(())
}

/// A `request` entry's fields, in the order and with the omissions of its
/// serde derive.
fn request(out: &mut Vec<u8>, entry: &Entry) {
    let Entry::Request(RequestLine {
        service,
        host,
        method,
        path,
        query,
        status,
        http,
        tier,
        bytes_in,
        bytes_out,
        duration_ms,
        duration_us,
        upstream,
        headers,
        websocket,
        client_gone,
    }) = entry
    else {
        return;
    };
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"\"kind\":\"request\",\"service\":");
    string(out, service);
    out.extend_from_slice(b",\"host\":");
    string(out, host);
    out.extend_from_slice(b",\"method\":");
    string(out, method);
    out.extend_from_slice(b",\"path\":");
    string(out, path);
    if let Some(query) = query {
        out.extend_from_slice(b",\"query\":");
        string(out, query);
    }
    out.extend_from_slice(b",\"status\":");
    out.extend_from_slice(n.format(*status).as_bytes());
    out.extend_from_slice(b",\"http\":");
    string(out, http);
    out.extend_from_slice(match tier {
        ListenerTier::Explicit => b",\"tier\":\"explicit\"".as_slice(),
        ListenerTier::Transparent => b",\"tier\":\"transparent\"".as_slice(),
        ListenerTier::Gateway => b",\"tier\":\"gateway\"".as_slice(),
    });
    out.extend_from_slice(b",\"bytes_in\":");
    out.extend_from_slice(n.format(*bytes_in).as_bytes());
    if let Some(bytes_out) = bytes_out {
        out.extend_from_slice(b",\"bytes_out\":");
        out.extend_from_slice(n.format(*bytes_out).as_bytes());
    }
    out.extend_from_slice(b",\"duration_ms\":");
    out.extend_from_slice(n.format(*duration_ms).as_bytes());
    if let Some(duration_us) = duration_us {
        out.extend_from_slice(b",\"duration_us\":");
        out.extend_from_slice(n.format(*duration_us).as_bytes());
    }
    out.extend_from_slice(b",\"upstream\":");
    string(out, upstream);
    if !headers.is_empty() {
        out.extend_from_slice(b",\"headers\":[");
        for (i, (name, value)) in headers.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'[');
            string(out, name);
            out.push(b',');
            string(out, value);
            out.push(b']');
        }
        out.push(b']');
    }
    if *websocket {
        out.extend_from_slice(b",\"websocket\":true");
    }
    if *client_gone {
        out.extend_from_slice(b",\"client_gone\":true");
    }
}

/// serde_json's escape for each byte: 0 none, `u` for `\u00XX`, else the
/// letter after the backslash. Only control characters, `"` and `\` are
/// escaped (not DEL, not U+2028/U+2029).
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = b'u';
        b += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// True when one of the 8 bytes needs an escape: below 0x20, `"` or `\`
/// (exact, no false negatives; the byte-wise loop decides the rest).
fn any_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * u64::from(b'"'));
    let quote = q.wrapping_sub(ONES) & !q;
    let s = w ^ (ONES * u64::from(b'\\'));
    let slash = s.wrapping_sub(ONES) & !s;
    (below | quote | slash) & HIGHS != 0
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            if !any_escape(u64::from_le_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let escape = ESCAPE[usize::from(b)];
        if escape != 0 {
            out.extend_from_slice(&bytes[start..i]);
            out.push(b'\\');
            out.push(escape);
            if escape == b'u' {
                out.extend_from_slice(b"00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            start = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{
        BlockedLine, CheckLine, Coverage, MovedAside, PassthroughLine, ReservedPathLine,
        ResponseIncompleteLine, SessionLine, TlsAbandonedLine, TornTail, TrustFailureLine,
        TunnelCloseLine, UpstreamErrorLine,
    };
    use crate::entry::{Line, Mode};

    /// What serde writes for the line: the reference.
    fn serde_line(line: &Line) -> Vec<u8> {
        serde_json::to_vec(line).unwrap()
    }

    fn fast_line(line: &Line) -> Vec<u8> {
        let mut entry_part = Vec::new();
        fields(&mut entry_part, &line.entry).unwrap();
        let mut out = Vec::new();
        super::line(
            &mut out,
            line.v,
            line.seq,
            &line.ts,
            &entry_part,
            &line.prev,
        );
        out
    }

    /// A small xorshift: reproducible without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn text(&mut self) -> String {
            const PIECES: &[&str] = &[
                "a", "Z", "0", "/", "?", "=", "&", " ", "\"", "\\", "\\u0000", "\u{0}", "\u{1}",
                "\u{7}", "\u{8}", "\t", "\n", "\u{b}", "\u{c}", "\r", "\u{1b}", "\u{1f}", "\u{7f}",
                "\u{80}", "é", "ß", "\u{2028}", "\u{2029}", "\u{feff}", "😀", "中", "'", "<", ">",
                "sk_live_", "Bearer ", "abcdefgh", "%22", "}", "{", ",", ":",
            ];
            let len = match self.below(4) {
                0 => 0,
                1 => self.below(4),
                2 => self.below(20),
                _ => self.below(200),
            };
            (0..len)
                .map(|_| PIECES[self.below(PIECES.len() as u64) as usize])
                .collect()
        }

        fn number(&mut self) -> u64 {
            match self.below(4) {
                0 => 0,
                1 => u64::MAX,
                2 => self.below(1000),
                _ => self.next(),
            }
        }
    }

    fn random_request(r: &mut Rng) -> Entry {
        Entry::Request(RequestLine {
            service: r.text(),
            host: r.text(),
            method: r.text(),
            path: r.text(),
            query: (r.below(2) == 0).then(|| r.text()),
            status: r.number() as u16,
            http: r.text(),
            tier: match r.below(3) {
                0 => ListenerTier::Explicit,
                1 => ListenerTier::Transparent,
                _ => ListenerTier::Gateway,
            },
            bytes_in: r.number(),
            bytes_out: (r.below(2) == 0).then(|| r.number()),
            duration_ms: r.number(),
            duration_us: (r.below(2) == 0).then(|| r.number()),
            upstream: r.text(),
            headers: (0..r.below(4)).map(|_| (r.text(), r.text())).collect(),
            websocket: r.below(2) == 0,
            client_gone: r.below(2) == 0,
        })
    }

    #[test]
    fn request_lines_are_what_serde_writes() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for i in 0..20_000u64 {
            let line = Line {
                v: (r.below(5)) as u32,
                seq: if i % 2 == 0 { i } else { r.number() },
                ts: if i % 3 == 0 {
                    "2026-12-02T05:00:00.123Z".into()
                } else {
                    r.text()
                },
                entry: random_request(&mut r),
                prev: if i % 3 == 0 { "0".repeat(64) } else { r.text() },
            };
            let (want, got) = (serde_line(&line), fast_line(&line));
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "{line:?}"
            );
            assert_eq!(got, want);
        }
    }

    #[test]
    fn every_string_byte_escapes_as_serde_does() {
        // Each byte value (as a char) at each position of a 17-byte string,
        // so both the 8-byte skip and the byte-wise tail see it.
        for c in (0u32..0x100).filter_map(char::from_u32) {
            for at in 0..17 {
                let mut s: String = "x".repeat(17);
                s.replace_range(at..at + 1, &c.to_string());
                let mut got = Vec::new();
                string(&mut got, &s);
                assert_eq!(got, serde_json::to_vec(&s).unwrap(), "{s:?}");
            }
        }
    }

    #[test]
    fn other_kinds_are_what_serde_writes() {
        let entries = [
            Entry::Session(SessionLine {
                run_id: "run \"1\"\n".into(),
                sandbox_id: "sbx".into(),
                mode: Mode::Strict,
                tier: ListenerTier::Transparent,
                twin: "http://t/\u{2028}".into(),
                pid: 7,
                version: "v".into(),
                listen: "127.0.0.1:0".into(),
                key_id: Some("k".into()),
                proxy_uid: Some(1),
                twin_heads: Some([("stripe".to_string(), 3u64)].into()),
                ..SessionLine::test()
            }),
            Entry::Seal {
                sealed_seq: 9,
                signature: "ab".repeat(32),
                key_id: "k".into(),
                reason: "interval".into(),
            },
            Entry::Tamper {
                what: "cut".into(),
                detail: "the ledger file was cut to 0 bytes".into(),
            },
            Entry::Passthrough(PassthroughLine::test("example.com")),
        ];
        for (seq, entry) in entries.into_iter().enumerate() {
            let line = Line {
                v: crate::entry::LEDGER_VERSION,
                seq: seq as u64 + 1,
                ts: "2026-12-02T05:00:00.123Z".into(),
                entry,
                prev: crate::entry::GENESIS_PREV.into(),
            };
            assert_eq!(
                String::from_utf8(fast_line(&line)).unwrap(),
                String::from_utf8(serde_line(&line)).unwrap()
            );
        }
    }

    /// Every kind held in a named struct, with each optional field set:
    /// the bytes both encoders write are the format's (as written when
    /// these were struct variants), and they read back to the same line,
    /// also with `kind` after the fields (a hand-made file).
    #[test]
    fn every_struct_kind_writes_its_bytes_and_reads_back() {
        let cases: Vec<(Entry, &str)> = vec![
            (
                SessionLine {
                    mode: Mode::Strict,
                    tier: ListenerTier::Transparent,
                    recovered_torn_tail: Some(TornTail { line: 3, bytes: 9 }),
                    key_id: Some("kid".into()),
                    public_key: Some("pk".into()),
                    key_storage: Some("memory".into()),
                    proxy_uid: Some(1),
                    workload_uid: Some(2),
                    twin_heads: Some([("stripe".to_string(), 3u64)].into()),
                    moved_aside: Some(Box::new(MovedAside {
                        file: "ledger.jsonl.old".into(),
                        head_seq: 4,
                        head_hash: "hh".into(),
                        why: "chain".into(),
                        requests: Some(5),
                    })),
                    coverage: Some(Box::new(Coverage {
                        tcp_ports: Some(vec![443]),
                        quic: "sink".into(),
                        dns: "stub".into(),
                        udp_other: "dropped".into(),
                        ip_other: "dropped".into(),
                        ipv6: true,
                        exempt: vec!["uid 0".into()],
                        installed_by: "veris".into(),
                        isolation: Some("netns".into()),
                        sockets_reachable: vec!["/tmp".into()],
                        bundles: vec!["/b.pem".into()],
                        upstream_proxy: true,
                    })),
                    ..SessionLine::test()
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"session","run_id":"a1b2c3d4e5f60718","sandbox_id":"sbx_a1b2c3","mode":"strict","tier":"transparent","twin":"http://127.0.0.1:41234","pid":4242,"version":"0.1.0","listen":"127.0.0.1:43210","recovered_torn_tail":{"line":3,"bytes":9},"key_id":"kid","public_key":"pk","key_storage":"memory","proxy_uid":1,"workload_uid":2,"twin_heads":{"stripe":3},"moved_aside":{"file":"ledger.jsonl.old","head_seq":4,"head_hash":"hh","why":"chain","requests":5},"coverage":{"tcp_ports":[443],"quic":"sink","dns":"stub","udp_other":"dropped","ip_other":"dropped","ipv6":true,"exempt":["uid 0"],"installed_by":"veris","isolation":"netns","sockets_reachable":["/tmp"],"bundles":["/b.pem"],"upstream_proxy":true},"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                RequestLine {
                    query: Some("a=1".into()),
                    bytes_in: 42,
                    bytes_out: Some(7),
                    duration_ms: 3,
                    duration_us: Some(3_250),
                    headers: vec![("user-agent".into(), "curl".into())],
                    websocket: true,
                    client_gone: true,
                    ..RequestLine::test("stripe", "POST", "/v1/charges")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"request","service":"stripe","host":"api.stripe.com","method":"POST","path":"/v1/charges","query":"a=1","status":200,"http":"HTTP/1.1","tier":"explicit","bytes_in":42,"bytes_out":7,"duration_ms":3,"duration_us":3250,"upstream":"http://127.0.0.1:41234/s/sbx_a1b2c3/stripe/v1/charges","headers":[["user-agent","curl"]],"websocket":true,"client_gone":true,"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                PassthroughLine {
                    bytes_in: 1,
                    bytes_out: 2,
                    duration_ms: 3,
                    dst: Some("192.0.2.1:443".into()),
                    ..PassthroughLine::test("example.com")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"passthrough","host":"example.com","port":443,"tier":"explicit","bytes_in":1,"bytes_out":2,"duration_ms":3,"reason":"mode","dst":"192.0.2.1:443","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                BlockedLine {
                    method: Some("GET".into()),
                    path: Some("/x".into()),
                    dst: Some("192.0.2.1:443".into()),
                    ..BlockedLine::test("example.com")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"blocked","host":"example.com","port":443,"tier":"explicit","method":"GET","path":"/x","reason":"strict mode: no service claims this host","dst":"192.0.2.1:443","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                UpstreamErrorLine {
                    bytes_in: Some(4),
                    declared_in: Some(10),
                    error: "veris_request_body_incomplete".into(),
                    ..UpstreamErrorLine::test("stripe", "POST", "/v1/charges")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"upstream_error","service":"stripe","host":"api.stripe.com","method":"POST","path":"/v1/charges","upstream":"http://127.0.0.1:41234/s/sbx_a1b2c3/stripe/v1/charges","status":502,"error":"veris_request_body_incomplete","tier":"explicit","duration_ms":0,"bytes_in":4,"declared_in":10,"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                TrustFailureLine {
                    service: Some("stripe".into()),
                    ..TrustFailureLine::test("api.stripe.com")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"trust_failure","host":"api.stripe.com","port":443,"tier":"explicit","service":"stripe","alert":"unknown_ca","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                ReservedPathLine::test("stripe", "/veris/state").into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"reserved_path","service":"stripe","host":"api.stripe.com","method":"GET","path":"/veris/state","status":404,"error":"veris_reserved_path","tier":"explicit","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                CheckLine {
                    detail: "canary".into(),
                    since_seq: 1,
                    until_seq: 9,
                    ..CheckLine::test("canary", "ok")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"check","name":"canary","status":"ok","detail":"canary","since_seq":1,"until_seq":9,"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                TlsAbandonedLine {
                    service: Some("stripe".into()),
                    stage: "no_request".into(),
                    alert: Some("close_notify".into()),
                    alpn: Some("h2".into()),
                    ..TlsAbandonedLine::test("api.stripe.com")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"tls_abandoned","host":"api.stripe.com","port":443,"tier":"explicit","service":"stripe","stage":"no_request","alert":"close_notify","alpn":"h2","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                ResponseIncompleteLine {
                    bytes: 5,
                    declared: Some(10),
                    ..ResponseIncompleteLine::test(2, "stripe")
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"response_incomplete","of":2,"service":"stripe","bytes":5,"declared":10,"reason":"twin_cut","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                TunnelCloseLine {
                    bytes_in: 1,
                    bytes_out: 2,
                    duration_ms: 3,
                    error: Some("reset".into()),
                    ..TunnelCloseLine::test(2)
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"tunnel_close","of":2,"bytes_in":1,"bytes_out":2,"duration_ms":3,"error":"reset","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                crate::entry::CallbackLine {
                    service: "stripe".into(),
                    event: "charge.succeeded".into(),
                    event_id: "evt_1".into(),
                    target: "127.0.0.1:4242".into(),
                    method: "POST".into(),
                    path: "/webhook".into(),
                    query: None,
                    status: Some(200),
                    error: None,
                    duration_ms: 3,
                    duration_us: None,
                    attempt: 1,
                    origin: "twin".into(),
                    fault: None,
                    tls: false,
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"callback","service":"stripe","event":"charge.succeeded","event_id":"evt_1","target":"127.0.0.1:4242","method":"POST","path":"/webhook","status":200,"duration_ms":3,"attempt":1,"origin":"twin","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                crate::entry::CallbackLine {
                    service: "stripe".into(),
                    event: "customer.created".into(),
                    event_id: "evt_2".into(),
                    target: "127.0.0.1:4242".into(),
                    method: "POST".into(),
                    path: "/webhook".into(),
                    query: None,
                    status: Some(400),
                    error: None,
                    duration_ms: 3,
                    duration_us: None,
                    attempt: 1,
                    origin: "trigger".into(),
                    fault: Some("delay=1s,bad-signature".into()),
                    tls: true,
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"callback","service":"stripe","event":"customer.created","event_id":"evt_2","target":"127.0.0.1:4242","method":"POST","path":"/webhook","status":400,"duration_ms":3,"attempt":1,"origin":"trigger","fault":"delay=1s,bad-signature","tls":true,"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
            (
                crate::entry::CallbackDroppedLine {
                    service: "stripe".into(),
                    events: 5,
                    reason: "queue_full".into(),
                }
                .into(),
                r#"{"v":9,"seq":2,"ts":"2026-12-02T05:00:00.123Z","kind":"callback_dropped","service":"stripe","events":5,"reason":"queue_full","prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
            ),
        ];
        for (entry, want) in cases {
            let kind = entry.kind();
            let line = Line {
                v: crate::entry::LEDGER_VERSION,
                seq: 2,
                ts: "2026-12-02T05:00:00.123Z".into(),
                entry,
                prev: crate::entry::GENESIS_PREV.into(),
            };
            let text = String::from_utf8(serde_line(&line)).unwrap();
            assert_eq!(text, want, "{kind}");
            assert_eq!(String::from_utf8(fast_line(&line)).unwrap(), want, "{kind}");
            assert_eq!(serde_json::from_str::<Line>(want).unwrap(), line, "{kind}");
            // `kind` last: read through the slow path, same line.
            let kind_field = format!(",\"kind\":\"{kind}\"");
            let late = want.replacen(&kind_field, "", 1).replacen(
                ",\"prev\":",
                &format!("{kind_field},\"prev\":"),
                1,
            );
            assert_ne!(late, want);
            assert_eq!(serde_json::from_str::<Line>(&late).unwrap(), line, "{kind}");
            // On its own, externally tagged: `{"<kind>":{<fields>}}`.
            let fields = &want[want.find(&kind_field).unwrap() + kind_field.len()..][1..]
                .split(",\"prev\":")
                .next()
                .unwrap();
            assert_eq!(
                serde_json::to_string(&line.entry).unwrap(),
                format!("{{\"{kind}\":{{{fields}}}}}"),
                "{kind}"
            );
        }
    }
}
