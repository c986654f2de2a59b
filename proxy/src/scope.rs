//! The names the interception CA may sign for (its X.509 name constraints,
//! [`veris_ca::Scope`]), decided in this one place:
//!
//! - every host the built-in catalog claims: all of its services, not only
//!   the ones routed now, so that `--services` can change without a new CA;
//! - every host pattern the routes claim (`*.acme.test` permits `acme.test`
//!   and every name under it);
//! - veris's own names ([`OWN`]);
//! - the caller's `extra` names: the gateway's `--tls-name`s, `veris ca
//!   rotate --name`.
//!
//! Hosts a proxy only tunnels (`allow_passthrough`, `@build`, loopback)
//! never get a leaf and are not in it. A strict-mode connection to a name
//! outside it is refused without a certificate ([`crate::inbound::tls`]).

use veris_ca::{CaError, Scope};

use crate::canary::CANARY_HOST;
use crate::catalog::CATALOG;
use crate::request::route::Router;

/// What veris itself mints leaves for: the canary host (the transparent
/// probe's TLS name), and `localhost` with the loopback addresses, which
/// the gateway's TLS listener and a TLS twin (`veris twin --tls`) present
/// by default. No other IP address is permitted unless a caller adds it.
pub const OWN: &[&str] = &[CANARY_HOST, "localhost", "127.0.0.0/8", "::1"];

/// Every host the built-in catalog claims.
pub fn catalog_hosts() -> impl Iterator<Item = &'static str> {
    CATALOG
        .iter()
        .flat_map(|s| s.claims.iter().map(|(host, _)| *host))
}

/// The scope of a CA made now: the catalog, `router`'s routes (when
/// given), [`OWN`] and `extra`.
pub fn scope(router: Option<&Router>, extra: &[String]) -> Result<Scope, CaError> {
    let mut scope = Scope::new();
    for name in catalog_hosts().chain(OWN.iter().copied()) {
        scope.permit(name)?;
    }
    for pattern in router.map(Router::routed_hosts).unwrap_or_default() {
        scope.permit(&pattern)?;
    }
    for name in extra {
        scope.permit(name)?;
    }
    Ok(scope)
}

/// The names a proxy routing with `router` must be able to mint for: each
/// routed host pattern (as the CA's `permits` reads it: `*.acme.test` as
/// `acme.test`) and the canary host.
pub fn needed(router: &Router) -> Vec<String> {
    let mut names: Vec<String> = router
        .routed_hosts()
        .into_iter()
        .map(|p| p.strip_prefix("*.").map(str::to_owned).unwrap_or(p))
        .collect();
    names.push(CANARY_HOST.to_owned());
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Flags, Settings};

    #[test]
    fn the_scope_holds_the_catalog_the_routes_and_our_own_names() {
        let settings = Settings::from_flags(Flags {
            listen: "127.0.0.1:0",
            twin: "http://127.0.0.1:1",
            sandbox_id: "sbx",
            services: &[],
            routes: &["acme=*.acme.test".to_string()],
            mode: veris_receipt::Mode::Strict,
            allow_passthrough: &["@build".to_string()],
        })
        .unwrap();
        let scope = scope(Some(&settings.router), &["gw.example".to_string()]).unwrap();
        for name in catalog_hosts() {
            assert!(scope.permits(name), "{name}");
        }
        for name in needed(&settings.router) {
            assert!(scope.permits(&name), "{name}");
        }
        for name in [
            "api.acme.test",
            "acme.test",
            "gw.example",
            "localhost",
            "127.0.0.1",
            "::1",
        ] {
            assert!(scope.permits(name), "{name}");
        }
        // Tunneled hosts and any other address get no leaf.
        for name in [
            "registry.npmjs.org",
            "example.org",
            "10.0.0.1",
            "2001:db8::1",
        ] {
            assert!(!scope.permits(name), "{name}");
        }
    }
}
