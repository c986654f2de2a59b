//! Inputs the fuzz targets (fuzz/, see fuzz/README.md) found, replayed on
//! the path they broke, so the normal suite keeps them fixed.

// Test code: a failed unwrap or expect is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::Uri;
use veris_host::{is_loopback, Host};
use veris_proxy::config::{Flags, Settings};
use veris_proxy::request::route::Route;
use veris_receipt::Mode;

fn router() -> veris_proxy::request::route::Router {
    Settings::from_flags(Flags {
        listen: "127.0.0.1:8080",
        twin: "http://127.0.0.1:1",
        sandbox_id: "fuzz",
        services: &[],
        routes: &[],
        mode: Mode::Strict,
        allow_passthrough: &["@build".to_string()],
    })
    .expect("the catalog builds")
    .router
}

/// connect_target, crash-6122aeb6: `CONNECT [:.localhost]:99`. The leg's
/// host was `:.localhost`, which the dialer resolves as loopback, while
/// routing normalized it again to the empty name and called it unmapped
/// (passed through "by mode" instead of "loopback"). Now the bracketed
/// non-address stays bracketed: neither loopback nor anything else.
#[test]
fn a_bracketed_non_address_connect_target_is_one_name_to_router_and_dialer() {
    let router = router();
    for target in [
        "[:.localhost]:99",
        "[:51.localhost]:99",
        "[:api.stripe.com]:443",
    ] {
        let uri = Uri::try_from(target).expect("http accepts it, as hyper does");
        let host = Host::new(uri.authority().expect("authority").host()).into_string();
        assert_eq!(Host::new(&host).into_string(), host, "{target}");
        let route = router.route_connection(&host);
        assert_eq!(
            is_loopback(&host),
            route == Route::Loopback,
            "{target}: {route:?}"
        );
        assert_eq!(route, Route::Unmapped, "{target}");
    }
    // Real addresses and names still route as before.
    assert_eq!(
        router.route_connection(&Host::new("[::1]:443").into_string()),
        Route::Loopback
    );
    assert!(matches!(
        router.route_connection(&Host::new("API.Stripe.com.:443").into_string()),
        Route::Service(_)
    ));
}

/// connect_target, crash-3e5d2f2f: `[::1.` (no closing bracket) was
/// `[::1` after one pass and `::1`, loopback, after a second.
#[test]
fn an_unclosed_bracket_normalizes_once_and_for_all() {
    for raw in ["[::1.", "[::1", "[127.0.0.1", "[:.localhost"] {
        let once = Host::new(raw).into_string();
        assert_eq!(Host::new(&once).into_string(), once, "{raw:?}");
    }
    assert!(!is_loopback(&Host::new("[::1.").into_string()));
}
