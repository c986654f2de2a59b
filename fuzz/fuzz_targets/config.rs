//! Route and config parsing (proxy/src/config.rs, route.rs): a config file's
//! text, and the same input as `--route`/`--allow-passthrough` flags (one per
//! line). Never a panic: every refusal is a ConfigError with words.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use veris_proxy::config::{Flags, Settings};
use veris_proxy::request::route::HostPattern;
use veris_receipt::Mode;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Settings::from_json(text, "fuzz.json") {
        assert!(!e.to_string().is_empty());
    }
    let (routes, allow) = common::split2(data, 0);
    let lines = |b: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(b)
            .lines()
            .take(64)
            .map(str::to_string)
            .collect()
    };
    let (routes, allow) = (lines(routes), lines(allow));
    for a in &allow {
        let _ = HostPattern::parse(a);
    }
    let settings = Settings::from_flags(Flags {
        listen: "127.0.0.1:8080",
        twin: "http://127.0.0.1:1",
        sandbox_id: "fuzz",
        services: &["stripe".to_string()],
        routes: &routes,
        mode: Mode::Passthrough,
        allow_passthrough: &allow,
    });
    if let Ok(s) = settings {
        for r in &routes {
            let _ = s.router.route(r, r);
        }
    }
});
