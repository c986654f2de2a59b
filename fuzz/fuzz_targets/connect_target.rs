//! CONNECT targets and absolute-form authorities: the request-target bytes
//! parsed as hyper does (`http::Uri`), then what `Proxy::connect` does with
//! them (proxy/src/lib.rs): a port from 1 to 65535 or a 400, the host
//! normalized (veris_host::Host) and routed (Router::route_connection,
//! the real catalog in strict mode), loopback checks included.
#![no_main]

use std::sync::OnceLock;

use http::Uri;
use libfuzzer_sys::fuzz_target;
use veris_proxy::config::{Flags, Settings};
use veris_host::{is_loopback, Host};
use veris_proxy::request::route::Route;
use veris_receipt::Mode;

fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| {
        Settings::from_flags(Flags {
            listen: "127.0.0.1:8080",
            twin: "http://127.0.0.1:1",
            sandbox_id: "fuzz",
            services: &[],
            routes: &["acme=api.acme.test/v1".to_string()],
            mode: Mode::Strict,
            allow_passthrough: &["@build".to_string()],
        })
        .expect("the catalog builds")
    })
}

fuzz_target!(|data: &[u8]| {
    // Normalizing is idempotent (the proxy normalizes, routing again).
    let raw = String::from_utf8_lossy(data);
    let once = Host::new(&raw).into_string();
    assert_eq!(Host::new(&once).into_string(), once, "{raw:?}");
    let Ok(uri) = Uri::try_from(data) else { return };
    let Some(authority) = uri.authority() else {
        return;
    };
    let port = authority.port_u16().filter(|p| *p != 0);
    let host = Host::new(authority.host()).into_string();
    let router = &settings().router;
    let route = router.route_connection(&host);
    if is_loopback(&host) {
        assert!(matches!(route, Route::Loopback), "{host:?}: {route:?}");
    }
    // The leg's host is routed again per request, with a path.
    let _ = router.route(&host, uri.path());
    let _ = port;
});
