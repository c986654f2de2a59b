//! Golden ledger files and the receipts built from them, plus tamper tests.
//!
//! The ledgers in `tests/golden/*.jsonl` are produced by the generators below
//! with fixed timestamps; the test checks the committed bytes still equal what
//! the current encoder writes (the on-disk format did not drift) and that the
//! text and JSON receipts equal their golden files. After a deliberate format
//! change, regenerate with `VERIS_BLESS=1 cargo test -p veris-receipt`.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use veris_receipt::entry::{Entry, Line, ListenerTier, Mode, TornTail, GENESIS_PREV};
use veris_receipt::ledger::{self, encode, line_hash};
use veris_receipt::receipt::{
    self, build, evaluate, render_text, IntegrityStatus, Options, Requirement, WindowSpec,
    EMPTY_SENTENCE,
};
use veris_receipt::{
    BlockedLine, CheckLine, PassthroughLine, RequestLine, SessionLine, TlsAbandonedLine,
    TrustFailureLine, UpstreamErrorLine,
};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the golden file, or writes it under `VERIS_BLESS=1`.
fn golden(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("VERIS_BLESS").is_some() {
        // Tests run in parallel and several read the same ledger: replace the
        // file atomically so no reader sees it half written.
        let tmp = path.with_extension(format!("tmp-{:?}", std::thread::current().id()));
        std::fs::write(&tmp, actual).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with VERIS_BLESS=1", path.display()));
    assert_eq!(actual, expected, "golden file {name} differs");
}

/// Encodes entries as a chained ledger with timestamps one second apart, in
/// the version-1 form (no version-2 field): the old form stays readable.
fn chain(entries: Vec<Entry>) -> String {
    chain_v(entries, 1)
}

/// [`chain`] with lines of version `v`.
fn chain_v(entries: Vec<Entry>, v: u32) -> String {
    let mut out = String::new();
    let mut prev = GENESIS_PREV.to_string();
    for (i, entry) in entries.into_iter().enumerate() {
        let seq = i as u64 + 1;
        let line = Line {
            v,
            seq,
            ts: format!(
                "2026-11-29T07:{:02}:{:02}.{:03}Z",
                20 + seq / 60,
                seq % 60,
                seq
            ),
            entry,
            prev,
        };
        let text = encode(&line).unwrap();
        prev = line_hash(text.as_bytes());
        out.push_str(&text);
        out.push('\n');
    }
    out
}

fn session(sandbox: &str, mode: Mode, tier: ListenerTier, torn: Option<TornTail>) -> Entry {
    Entry::Session(SessionLine {
        run_id: "run_0001".into(),
        sandbox_id: sandbox.into(),
        mode,
        tier,
        twin: "https://twin.example/".into(),
        pid: 4242,
        version: "0.1.0".into(),
        listen: "127.0.0.1:8080".into(),
        recovered_torn_tail: torn,
        key_id: None,
        public_key: None,
        key_storage: None,
        proxy_uid: None,
        workload_uid: None,
        twin_heads: None,
        moved_aside: None,
        coverage: None,
    })
}

fn request(service: &str, host: &str, method: &str, path: &str, status: u16) -> Entry {
    request_via(
        ListenerTier::Transparent,
        service,
        host,
        method,
        path,
        status,
    )
}

fn request_via(
    tier: ListenerTier,
    service: &str,
    host: &str,
    method: &str,
    path: &str,
    status: u16,
) -> Entry {
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (path.to_string(), None),
    };
    Entry::Request(RequestLine {
        service: service.into(),
        host: host.into(),
        method: method.into(),
        upstream: format!("https://twin.example/s/sbx/{service}{path}"),
        path,
        query,
        status,
        http: "HTTP/1.1".into(),
        tier,
        bytes_in: 0,
        bytes_out: Some(120),
        duration_ms: 4,
        duration_us: None,
        headers: vec![("authorization".into(), "[redacted]".into())],
        websocket: false,
        client_gone: false,
    })
}

/// A version-2 transparent session whose recorded rules leave nothing open:
/// every TCP port, QUIC sunk, other UDP dropped, DNS answered by veris, an
/// unprivileged workload.
fn covered_session(sandbox: &str) -> Entry {
    let mut s = session(sandbox, Mode::Passthrough, ListenerTier::Transparent, None);
    if let Entry::Session(SessionLine {
        coverage,
        workload_uid,
        proxy_uid,
        ..
    }) = &mut s
    {
        *coverage = Some(Box::new(veris_receipt::Coverage {
            tcp_ports: None,
            quic: "sink".into(),
            dns: "stub".into(),
            udp_other: "dropped".into(),
            ip_other: "dropped".into(),
            ipv6: true,
            exempt: vec!["uid 14741".into()],
            installed_by: "veris".into(),
            isolation: None,
            sockets_reachable: Vec::new(),
            bundles: Vec::new(),
            upstream_proxy: false,
        }));
        *workload_uid = Some(1000);
        *proxy_uid = Some(14741);
    }
    s
}

fn basic_ledger() -> String {
    chain_v(
        vec![
            covered_session("sbx_a1b2c3"),
            request("stripe", "api.stripe.com", "POST", "/v1/charges", 200),
        ],
        2,
    )
}

fn rich_ledger() -> String {
    let mut e = vec![session(
        "sbx_rich",
        Mode::Strict,
        ListenerTier::Explicit,
        None,
    )];
    for i in 0..23 {
        e.push(request_via(
            ListenerTier::Explicit,
            "stripe",
            "api.stripe.com",
            "GET",
            &format!("/v1/customers/cus_{i:03}"),
            200,
        ));
    }
    e.push(request_via(
        ListenerTier::Explicit,
        "google-calendar",
        "www.googleapis.com:443",
        "GET",
        "/calendar/v3/calendars/primary/events?maxResults=5&key=[redacted]",
        200,
    ));
    e.push(Entry::UpstreamError(UpstreamErrorLine {
        service: "stripe".into(),
        host: "api.stripe.com".into(),
        method: "POST".into(),
        path: "/v1/charges".into(),
        upstream: "https://twin.example/s/sbx_rich/stripe/v1/charges".into(),
        status: 502,
        error: "veris_upstream_unreachable".into(),
        tier: ListenerTier::Explicit,
        duration_ms: 30,
        bytes_in: None,
        declared_in: None,
    }));
    e.push(Entry::Blocked(BlockedLine {
        host: "evil.example".into(),
        port: 443,
        tier: ListenerTier::Explicit,
        method: Some("GET".into()),
        path: Some("/".into()),
        reason: "strict".into(),
        dst: None,
    }));
    for _ in 0..2 {
        e.push(Entry::Passthrough(PassthroughLine {
            host: "registry.npmjs.org".into(),
            port: 443,
            tier: ListenerTier::Explicit,
            bytes_in: 100,
            bytes_out: 2000,
            duration_ms: 50,
            reason: "allow_passthrough".into(),
            dst: None,
        }));
    }
    // A restart that set a torn line aside, then one more request.
    e.push(session(
        "sbx_rich",
        Mode::Strict,
        ListenerTier::Explicit,
        Some(TornTail {
            line: 30,
            bytes: 17,
        }),
    ));
    e.push(request_via(
        ListenerTier::Explicit,
        "stripe",
        "api.stripe.com",
        "POST",
        "/v1/charges",
        200,
    ));
    chain(e)
}

fn empty_ledger() -> String {
    chain(vec![session(
        "sbx_empty",
        Mode::Passthrough,
        ListenerTier::Transparent,
        None,
    )])
}

fn ledger_file(name: &str, generated: String) -> Vec<u8> {
    golden(name, &generated);
    std::fs::read(golden_dir().join(name)).unwrap()
}

/// The whole file, every session (`veris receipt --all`).
fn all() -> Options {
    Options {
        scope: WindowSpec::All,
        ..Options::default()
    }
}

fn receipt_of(bytes: &[u8], options: &Options) -> receipt::Receipt {
    build(&ledger::read_bytes(bytes), options)
}

fn json(r: &receipt::Receipt) -> String {
    serde_json::to_string_pretty(r).unwrap() + "\n"
}

#[test]
fn design_example_renders_exactly() {
    // DESIGN §8, verbatim but for the path, which is the workload's text
    // and so quoted (§7a.17). Integrity cannot be `verified` from a ledger
    // file alone, so the model is filled in by hand where build() would say
    // unverified (proxy not live).
    let bytes = ledger_file("basic.jsonl", basic_ledger());
    let mut r = receipt_of(&bytes, &Options::default());
    r.integrity.status = IntegrityStatus::Verified;
    r.integrity.reason = None;
    let expected = "\
Veris receipt — twin sbx_a1b2c3
  interception: transparent   integrity: verified
  leaks: none

1 request(s) reached the twin:
  stripe: 1 request(s)
    POST \"/v1/charges\" -> 200
";
    assert_eq!(render_text(&r), expected);
}

#[test]
fn basic_receipt_is_golden() {
    let bytes = ledger_file("basic.jsonl", basic_ledger());
    let read = ledger::read_bytes(&bytes);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    let r = build(&read, &Options::default());
    assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
    golden("basic.txt", &render_text(&r));
    golden("basic.json", &json(&r));
    // The JSON form reads back into the same model.
    let back: receipt::Receipt = serde_json::from_str(&json(&r)).unwrap();
    assert_eq!(back, r);
    assert_eq!(evaluate(&r, &[], false).exit_code, 0);
}

#[test]
fn rich_receipt_is_golden() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let r = receipt_of(&bytes, &all());
    assert_eq!(r.total_requests(), 25);
    assert_eq!(r.services["stripe"].requests, 24);
    assert_eq!(
        r.leaks,
        [
            "direct-egress-possible",
            "udp-quic-possible",
            "host-daemon-escape-possible",
            "ech-possible"
        ]
    );
    assert_eq!(r.upstream_errors.len(), 1);
    golden("rich.txt", &render_text(&r));
    golden("rich.json", &json(&r));
    // The committed JSON (the published form) reads back into the model.
    let committed = std::fs::read_to_string(golden_dir().join("rich.json")).unwrap();
    let back: receipt::Receipt = serde_json::from_str(&committed).unwrap();
    assert_eq!(back, r);
    assert!(back.services["stripe"].entries.len() == 24 && !back.services["stripe"].capped);
}

#[test]
fn the_default_window_is_the_latest_session() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let r = receipt_of(&bytes, &Options::default());
    // The restart at seq 30 opened a new session with one request.
    assert_eq!(r.window.since_seq, 29);
    assert_eq!(r.total_requests(), 1);
    assert!(!render_text(&r).contains("since seq"));
    assert_eq!(receipt_of(&bytes, &all()).total_requests(), 25);
}

#[test]
fn since_and_service_narrow_the_window() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let r = receipt_of(
        &bytes,
        &Options {
            scope: WindowSpec::Since(20),
            ..Options::default()
        },
    );
    assert_eq!(r.window.since_seq, 20);
    assert_eq!(r.window.until_seq, 31);
    golden("rich-since-20.txt", &render_text(&r));
    let r = receipt_of(
        &bytes,
        &Options {
            service: Some("google-calendar".into()),
            ..all()
        },
    );
    assert_eq!(r.services.keys().collect::<Vec<_>>(), ["google-calendar"]);
    assert!(r.upstream_errors.is_empty());
    assert_eq!(r.services["google-calendar"].hosts["www.googleapis.com"], 1);
}

#[test]
fn empty_receipt_says_so_and_exits_3() {
    let bytes = ledger_file("empty.jsonl", empty_ledger());
    let r = receipt_of(&bytes, &Options::default());
    let text = render_text(&r);
    golden("empty.txt", &text);
    assert!(text.contains(EMPTY_SENTENCE));
    let v = evaluate(&r, &[], false);
    assert_eq!(v.exit_code, 3);
    assert_eq!(v.lines, [EMPTY_SENTENCE]);
    let v = evaluate(&r, &[], true);
    assert_eq!(v.exit_code, 0);
    assert!(v.lines.is_empty());
    // A missing ledger is an empty one too.
    let r = build(
        &ledger::read(&golden_dir().join("does-not-exist.jsonl")).unwrap(),
        &Options::default(),
    );
    assert_eq!(evaluate(&r, &[], false).exit_code, 3);
    assert!(render_text(&r).contains("twin unknown (no session line)"));
}

#[test]
fn requirements_report_wanted_and_seen() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let r = receipt_of(&bytes, &all());
    let met = [
        Requirement::parse_service("stripe:24").unwrap(),
        Requirement::parse_service("google-calendar").unwrap(),
        Requirement::parse_host("WWW.googleapis.com:1").unwrap(),
        Requirement::parse_request("stripe POST /v1/charges").unwrap(),
        Requirement::parse_request("stripe get /v1/customers/cus_007").unwrap(),
    ];
    let v = evaluate(&r, &met, false);
    assert_eq!(v.exit_code, 0, "{:?}", v.lines);

    let unmet = [
        Requirement::parse_service("stripe:30").unwrap(),
        Requirement::parse_service("hubspot").unwrap(),
        Requirement::parse_host("api.github.com").unwrap(),
        Requirement::parse_request("google-calendar POST /calendar/v3/calendars").unwrap(),
        Requirement::parse_request("notion GET /v1/pages").unwrap(),
    ];
    let v = evaluate(&r, &unmet, false);
    assert_eq!(v.exit_code, 3);
    assert_eq!(
        v.lines,
        [
            "required service stripe: at least 30 request(s) answered 2xx; saw 24, with status 200",
            "required service hubspot: at least 1 request(s) answered 2xx; saw 0",
            "required host \"api.github.com\": at least 1 request(s) answered 2xx; saw 0",
            "required request google-calendar POST \"/calendar/v3/calendars\" answered 2xx: saw 0; \
             google-calendar saw 1 request(s): GET \"/calendar/v3/calendars/primary/events\" (1)",
            "required request notion GET \"/v1/pages\" answered 2xx: saw 0; notion saw 0 requests",
        ]
    );
}

#[test]
fn a_requirement_counts_success_unless_its_status_clause_says_otherwise() {
    // A charge the twin refused (400), one it declined (402) at a path
    // with a trailing slash, and a customer created (200).
    let bytes = chain(vec![
        session("sbx_st", Mode::Passthrough, ListenerTier::Explicit, None),
        request("stripe", "api.stripe.com", "POST", "/v1/charges", 400),
        request("stripe", "api.stripe.com", "POST", "/v1/charges/", 402),
        request("stripe", "api.stripe.com", "POST", "/v1/customers", 200),
    ]);
    let r = receipt_of(bytes.as_bytes(), &Options::default());
    let req = |s: &str| Requirement::parse_request(s).unwrap();
    let v = evaluate(&r, &[req("stripe POST /v1/charges")], false);
    assert_eq!(v.exit_code, 3);
    assert_eq!(
        v.lines,
        ["required request stripe POST \"/v1/charges\" answered 2xx: saw 2, with statuses 400 (1), 402 (1)"]
    );
    assert_eq!(v.requirements[0].status.as_deref(), Some("2xx"));
    assert_eq!(v.requirements[0].counted, Some(0));
    assert_eq!(
        v.requirements[0].seen_statuses,
        std::collections::BTreeMap::from([(400, 1), (402, 1)])
    );
    for met in [
        "stripe POST /v1/charges status=4xx",
        "stripe POST /v1/charges status=402",
        "stripe POST /v1/charges/ status=400",
        "stripe POST /v1/charges status=any",
        "stripe POST /v1/customers/",
    ] {
        let v = evaluate(&r, &[req(met)], false);
        assert_eq!(v.exit_code, 0, "{met}: {:?}", v.lines);
    }
    let service = |s: &str| Requirement::parse_service(s).unwrap();
    let v = evaluate(&r, &[service("stripe:2")], false);
    assert_eq!(
        v.lines,
        ["required service stripe: at least 2 request(s) answered 2xx; saw 3, with statuses 200 (1), 400 (1), 402 (1)"]
    );
    assert_eq!(
        evaluate(&r, &[service("stripe:2 status=4xx")], false).exit_code,
        0
    );
    assert_eq!(
        evaluate(&r, &[service("stripe:3 status=any")], false).exit_code,
        0
    );
    let v = evaluate(
        &r,
        &[Requirement::parse_host("api.stripe.com:1 status=500").unwrap()],
        false,
    );
    assert_eq!(
        v.lines,
        ["required host \"api.stripe.com\": at least 1 request(s) answered 500; saw 3, with statuses 200 (1), 400 (1), 402 (1)"]
    );
    // The JSON receipt carries each requirement's filter and what was seen.
    let mut judged = r.clone();
    judged.requirements = v.requirements;
    let j: serde_json::Value = serde_json::to_value(&judged).unwrap();
    assert_eq!(j["requirements"][0]["status"], "500");
    assert_eq!(j["requirements"][0]["seen_statuses"]["400"], 1);
    assert_eq!(j["requirements"][0]["holds"], false);
    assert_eq!(
        j["services"]["stripe"]["call_statuses"]["POST /v1/charges/"]["402"],
        1
    );
}

#[test]
fn a_status_clause_is_the_last_word_and_nothing_else_may_follow() {
    use veris_receipt::receipt::StatusFilter;
    assert_eq!(
        Requirement::parse_service("stripe:2 status=4xx").unwrap(),
        Requirement::Service {
            name: "stripe".into(),
            min: 2,
            status: StatusFilter::Class(4)
        }
    );
    assert_eq!(
        Requirement::parse_host("api.stripe.com status=any").unwrap(),
        Requirement::Host {
            host: "api.stripe.com".into(),
            min: 1,
            status: StatusFilter::Any
        }
    );
    for bad in [
        "stripe status=",
        "stripe status=20",
        "stripe status=2x",
        "stripe status=600",
        "stripe status=6xx",
        "stripe status=2xx,402",
        "stripe status:4xx",
        "stripe:1 statuses=4xx",
    ] {
        let err = Requirement::parse_service(bad).unwrap_err().to_string();
        assert!(
            err.contains("status=CODE") && err.contains("status=Nxx"),
            "{bad:?}: {err}"
        );
    }
    for bad in ["stripe:1 4xx", "stripe 1", "stripe:1 status=4xx extra"] {
        let err = Requirement::parse_service(bad).unwrap_err().to_string();
        assert!(err.contains("status=CODE"), "{bad:?}: {err}");
    }
    for bad in [
        "stripe POST /v1/charges 402",
        "stripe POST /v1/charges status=4xy",
    ] {
        let err = Requirement::parse_request(bad).unwrap_err().to_string();
        assert!(err.contains("status="), "{bad:?}: {err}");
    }
    let err = Requirement::parse_request("stripe POST /v1/\u{1b}[0m").unwrap_err();
    assert!(err.to_string().contains("\\u{1b}"), "{err}");
}

#[test]
fn upstream_errors_did_not_reach_the_twin() {
    let bytes = ledger_file("upstream-error.jsonl", upstream_error_ledger());
    let r = receipt_of(&bytes, &Options::default());
    assert_eq!(r.total_requests(), 0);
    let text = render_text(&r);
    golden("upstream-error.txt", &text);
    assert!(text.contains(
        "upstream errors (did not reach the twin): 1 \
         (stripe POST \"/v1/charges\" -> 502 veris_upstream_unreachable)"
    ));
    let v = evaluate(
        &r,
        &[Requirement::parse_request("stripe POST /v1/charges").unwrap()],
        true,
    );
    assert_eq!(v.exit_code, 3);
    assert_eq!(
        v.lines,
        ["required request stripe POST \"/v1/charges\" answered 2xx: saw 0; stripe saw 0 requests"]
    );
}

fn upstream_error_ledger() -> String {
    chain(vec![
        session("sbx_up", Mode::Passthrough, ListenerTier::Transparent, None),
        Entry::UpstreamError(UpstreamErrorLine {
            service: "stripe".into(),
            host: "api.stripe.com".into(),
            method: "POST".into(),
            path: "/v1/charges".into(),
            upstream: "https://twin.example/s/sbx_up/stripe/v1/charges".into(),
            status: 502,
            error: "veris_upstream_unreachable".into(),
            tier: ListenerTier::Transparent,
            duration_ms: 30,
            bytes_in: None,
            declared_in: None,
        }),
    ])
}

#[test]
fn requirement_parse_errors_are_clear() {
    for bad in ["", ":2", "stripe:0", "stripe:x", "stripe:-1"] {
        let err = Requirement::parse_service(bad).unwrap_err().to_string();
        assert!(err.contains("expected NAME"), "{bad:?}: {err}");
    }
    for bad in [
        "stripe",
        "stripe POST",
        "stripe POST v1/charges",
        "a b c d",
        "stripe P0ST /x",
    ] {
        let err = Requirement::parse_request(bad).unwrap_err().to_string();
        assert!(err.contains("'SERVICE METHOD /path'"), "{bad:?}: {err}");
    }
    assert_eq!(
        Requirement::parse_host("API.Stripe.com:3").unwrap(),
        Requirement::Host {
            host: "api.stripe.com".into(),
            min: 3,
            status: veris_receipt::receipt::StatusFilter::SUCCESS,
        }
    );
}

// --- tampering -------------------------------------------------------------

fn lines_of(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    assert_eq!(v.pop().as_deref(), Some(&b""[..]));
    v
}

fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

fn assert_fails_at(bytes: &[u8], line: usize, what: &str) {
    let read = ledger::read_bytes(bytes);
    let first = read.first_problem().expect("tampering went unnoticed");
    assert_eq!(first.line, line, "{:?}", read.problems);
    assert!(first.what.contains(what), "{:?}", read.problems);
    let r = build(&read, &Options::default());
    assert_eq!(r.integrity.status, IntegrityStatus::Failed);
    let reason = r.integrity.reason.clone().unwrap();
    assert!(
        reason.starts_with(&format!("chain broken at line {line}: ")),
        "{reason}"
    );
    assert!(render_text(&r).contains(&format!("integrity: failed (chain broken at line {line}: ")));
    let v = evaluate(&r, &[], true);
    assert_eq!(v.exit_code, 3);
    assert_eq!(v.lines, [format!("integrity failed: {reason}")]);
}

#[test]
fn one_edited_byte_in_a_middle_line_names_that_line() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    // Line 7 is a 200 response: make it a 201.
    let text = String::from_utf8(lines[6].clone()).unwrap();
    lines[6] = text
        .replacen("\"status\":200", "\"status\":201", 1)
        .into_bytes();
    assert_ne!(lines[6], lines_of(&bytes)[6]);
    assert_fails_at(&join(&lines), 7, "prev hash mismatch");
}

#[test]
fn edited_prev_field_names_that_line() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    let n = lines[9].len();
    // The last hex digit of `prev` sits just before the closing `"}`.
    lines[9][n - 3] = if lines[9][n - 3] == b'0' { b'1' } else { b'0' };
    assert_fails_at(&join(&lines), 10, "prev hash mismatch");
}

#[test]
fn edited_seq_names_that_line() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    let text = String::from_utf8(lines[4].clone()).unwrap();
    lines[4] = text.replacen("\"seq\":5,", "\"seq\":6,", 1).into_bytes();
    assert_fails_at(&join(&lines), 5, "seq gap");
}

#[test]
fn a_deleted_middle_line_is_a_gap() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    lines.remove(11);
    assert_fails_at(
        &join(&lines),
        12,
        "seq gap: expected 12, found 13 (1 line(s) missing)",
    );
}

#[test]
fn swapped_lines_are_caught() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    lines.swap(3, 4);
    assert_fails_at(&join(&lines), 4, "seq gap");
}

#[test]
fn a_byte_that_breaks_json_names_that_line() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let mut lines = lines_of(&bytes);
    lines[14][0] = b'X';
    assert_fails_at(&join(&lines), 15, "");
}

#[test]
fn truncation_mid_line_is_a_torn_tail() {
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let lines = lines_of(&bytes);
    let keep = bytes.len() - lines.last().unwrap().len() / 2 - 1;
    let read = ledger::read_bytes(&bytes[..keep]);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    let torn = read.torn_tail.expect("torn tail not reported");
    assert_eq!(torn.line, lines.len());
    assert_eq!(
        torn.bytes,
        lines.last().unwrap().len() - lines.last().unwrap().len() / 2
    );
    // Reported, not accepted: the torn request is not counted.
    assert_eq!(read.lines.len(), lines.len() - 1);
    let r = build(&read, &all());
    assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
    let reason = r.integrity.reason.clone().unwrap();
    assert!(
        reason.contains(&format!(
            "torn last line {} ({} bytes) not counted",
            torn.line, torn.bytes
        )),
        "{reason}"
    );
    assert_eq!(r.total_requests(), 24);
    // Losing just the newline is torn too: a line is complete only with it.
    let read = ledger::read_bytes(&bytes[..bytes.len() - 1]);
    assert_eq!(read.torn_tail.map(|t| t.line), Some(lines.len()));
}

#[test]
fn a_truncated_file_that_ends_on_a_line_boundary_still_verifies() {
    // Cutting whole lines off the end is not detectable by the chain alone;
    // a fresh seal from the live proxy closes that gap. From the file alone
    // the receipt must not claim `verified`.
    let bytes = ledger_file("rich.jsonl", rich_ledger());
    let lines = lines_of(&bytes);
    let r = receipt_of(&join(&lines[..10]), &Options::default());
    assert_eq!(r.integrity.status, IntegrityStatus::Unverified);
    assert!(r.integrity.reason.unwrap().contains("proxy not live"));
}

#[test]
fn reading_the_file_matches_reading_the_bytes() {
    let path = golden_dir().join("rich.jsonl");
    let _ = ledger_file("rich.jsonl", rich_ledger());
    let from_file = ledger::read(&path).unwrap();
    assert!(from_file.problems.is_empty(), "{:?}", from_file.problems);
    assert_eq!(from_file.lines.len(), 31);
    assert_eq!(from_file.head.0, 31);
}

#[test]
fn a_version_1_receipt_still_reads() {
    // The JSON published before version 2 (no seal key, scope, reserved
    // paths): every addition has a default, so old consumers' files parse.
    let text = std::fs::read_to_string(golden_dir().join("basic-v1.json")).unwrap();
    let r: receipt::Receipt = serde_json::from_str(&text).unwrap();
    assert_eq!(r.version, 1);
    assert_eq!(r.seal_key, None);
    assert_eq!(r.window.scope, receipt::Scope::All);
    assert_eq!(r.services["stripe"].requests, 1);
}

// --- evidence: what the record says when connections end early ------------

/// Version-3 lines for connections that ended before a full exchange, beside
/// a version-2 `trust_failure` without a certificate alert (an older proxy
/// wrote those for any close during the handshake).
fn evidence_ledger() -> String {
    let tls = |host: &str, service: Option<&str>, stage: &str, alert: Option<&str>| {
        Entry::TlsAbandoned(TlsAbandonedLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Transparent,
            service: service.map(str::to_string),
            stage: stage.into(),
            alpn: None,
            alert: alert.map(str::to_string),
        })
    };
    let trust = |host: &str, service: &str, alert: &str| {
        Entry::TrustFailure(TrustFailureLine {
            host: host.into(),
            port: 443,
            tier: ListenerTier::Explicit,
            service: Some(service.into()),
            alert: alert.into(),
        })
    };
    let mut lines = chain_v(
        vec![
            covered_session("sbx_evidence"),
            request("stripe", "api.stripe.com", "POST", "/v1/charges", 200),
            tls("api.stripe.com", Some("stripe"), "handshake", None),
            tls(
                "api.stripe.com",
                Some("stripe"),
                "handshake",
                Some("user_canceled"),
            ),
            tls("api.stripe.com", Some("stripe"), "no_request", None),
            trust("api.github.com", "github", "unknown_ca"),
            tls("example.org", None, "no_request", None),
        ],
        3,
    );
    // An older proxy's line for a close without an alert: a note now.
    let old = chain_v(vec![trust("api.hubapi.com", "hubspot", "no_alert")], 2);
    let last: veris_receipt::Line = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    let mut line: veris_receipt::Line = serde_json::from_str(old.trim_end()).unwrap();
    line.seq = last.seq + 1;
    line.prev = line_hash(lines.lines().last().unwrap().as_bytes());
    lines.push_str(&encode(&line).unwrap());
    lines.push('\n');
    lines
}

#[test]
fn evidence_receipt_is_golden() {
    let bytes = ledger_file("evidence.jsonl", evidence_ledger());
    let read = ledger::read_bytes(&bytes);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    let r = build(&read, &Options::default());
    golden("evidence.txt", &render_text(&r));
    golden("evidence.json", &json(&r));
    let back: receipt::Receipt = serde_json::from_str(&json(&r)).unwrap();
    assert_eq!(back, r);
    // Only github's alert names the certificate.
    let refused: Vec<&str> = r.trust_failures.iter().map(|f| f.host.as_str()).collect();
    assert_eq!(refused, ["api.github.com"]);
    let notes: Vec<(&str, u64, u64)> = r
        .tls_abandoned
        .iter()
        .map(|a| (a.host.as_str(), a.handshakes, a.no_request))
        .collect();
    assert_eq!(
        notes,
        [
            ("api.hubapi.com", 1, 0),
            ("api.stripe.com", 2, 1),
            ("example.org", 0, 1)
        ]
    );
    let verdict = evaluate(&r, &[], false);
    assert_eq!(verdict.exit_code, 3);
    assert_eq!(verdict.lines.len(), 1, "{:?}", verdict.lines);
    assert!(verdict.lines[0].contains("api.github.com"));
}

/// A gateway sandbox's session line: the platform sends the sandbox's TCP
/// to the gateway (`installed_by: platform`); UDP is the platform's too.
fn gateway_session(sandbox: &str) -> Entry {
    let mut s = session(sandbox, Mode::Passthrough, ListenerTier::Gateway, None);
    if let Entry::Session(SessionLine { coverage, .. }) = &mut s {
        *coverage = Some(Box::new(veris_receipt::Coverage {
            tcp_ports: None,
            quic: "platform".into(),
            dns: "platform".into(),
            udp_other: "platform".into(),
            ip_other: "platform".into(),
            ipv6: true,
            exempt: Vec::new(),
            installed_by: "platform".into(),
            isolation: Some("gateway".into()),
            sockets_reachable: Vec::new(),
            bundles: Vec::new(),
            upstream_proxy: false,
        }));
    }
    s
}

/// Two sessions of one sandbox's gateway ledger (version 5, unsealed): the
/// first probed the canary from inside the sandbox, the latest did not, and
/// tunneled to a host no service claims.
fn gateway_ledger() -> String {
    let probe = Entry::Check(CheckLine {
        name: "canary".into(),
        status: "ok".into(),
        detail: "probed from inside sandbox sbx-gw through the gateway".into(),
        since_seq: 0,
        until_seq: 2,
    });
    let via = ListenerTier::Gateway;
    chain_v(
        vec![
            gateway_session("sbx-gw"),
            request_via(via, "stripe", "api.stripe.com", "GET", "/v1/balance", 200),
            probe,
            gateway_session("sbx-gw"),
            request_via(via, "stripe", "api.stripe.com", "POST", "/v1/charges", 200),
            Entry::Passthrough(PassthroughLine {
                tier: via,
                dst: Some("93.184.215.14:443".into()),
                ..PassthroughLine::test("registry.npmjs.org")
            }),
        ],
        5,
    )
}

/// The latest session of a gateway sandbox: `interception: gateway`, the
/// platform's word in the leaks, and no probe from the sandbox in its
/// window (the first session's does not count for it).
#[test]
fn gateway_receipt_is_golden() {
    let bytes = ledger_file("gateway.jsonl", gateway_ledger());
    let read = ledger::read_bytes(&bytes);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    let r = build(&read, &Options::default());
    let text = render_text(&r);
    golden("gateway.txt", &text);
    golden("gateway.json", &json(&r));
    let back: receipt::Receipt = serde_json::from_str(&json(&r)).unwrap();
    assert_eq!(back, r);
    assert!(text.contains("  interception: gateway   integrity: unverified ("));
    assert!(text.contains("no canary probe from the sandbox"));
    assert_eq!(
        r.leaks,
        ["platform-enforced", "udp-not-tunneled", "ech-possible"]
    );
    let json: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
    assert_eq!(json["interception"], "gateway");
    assert_eq!(json["services"]["stripe"]["entries"][0]["tier"], "gateway");
}
