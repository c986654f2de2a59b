//! The whole built-in twin request handler (`Twin::handle`), in-process, on
//! a current-thread runtime with paused time (a fixture's `hang_ms` costs
//! nothing). The input is an HTTP/1-like request: `METHOD TARGET` on the
//! first line, `Name: value` header lines, an empty line, the body. The twin
//! has the built-in fixtures and a credential (seeds carry it).
//!
//! Every answer must be JSON and never a 5xx, except the fixtures that are
//! faults by design (`/v1/test/fault/…`).
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::Request;
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use veris_twin::{Fixtures, Twin, TwinOptions};

const CREDENTIAL: &str = "fuzz-credential";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
    })
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(Fixtures::builtin)
}

/// The request the input describes, or `None` where hyper would have
/// refused it before the twin saw it (a bad method, target or header).
fn request(data: &[u8]) -> Option<Request<Full<Bytes>>> {
    let head_end = data
        .windows(2)
        .position(|w| w == b"\n\n")
        .map_or(data.len(), |i| i + 2);
    let (head, body) = data.split_at(head_end);
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.lines();
    let (method, target) = lines.next()?.split_once(' ')?;
    let mut builder = Request::builder().method(method).uri(target);
    for line in lines.take(64) {
        if let Some((name, value)) = line.split_once(':') {
            builder = builder.header(name.trim(), value.trim());
        }
    }
    builder.body(Full::new(Bytes::copy_from_slice(body))).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(req) = request(data) else { return };
    let path = req.uri().path().to_string();
    // A fresh twin each time: one input's stored objects never feed another.
    let twin = Twin::new(TwinOptions {
        fixtures: fixtures().clone(),
        sandbox: Some("sbx".into()),
        log: None,
        credential: Some(CREDENTIAL.into()),
    })
    .expect("twin");
    let (status, ctype, body) = runtime().block_on(async move {
        let resp = Arc::clone(&twin).handle(req).await;
        let status = resp.status();
        let ctype = resp.headers().get(CONTENT_TYPE).cloned();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("full body")
            .to_bytes();
        (status, ctype, body)
    });
    assert_eq!(
        ctype.as_ref().map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
    if status.is_server_error() {
        assert!(path.contains("/test/fault/"), "{status} for {path}: {json}");
    }
});
