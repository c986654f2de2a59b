//! Phase 5 and every other request the proxy answers itself instead of
//! forwarding: reserved vendor paths, names that do not stand for where the
//! bytes were headed (both tiers), strict mode's refusals, the host's
//! loopback from an isolated run, and the canary.

use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tracing::{info, warn};
use veris_receipt::{redact, Entry, Mode};
use veris_receipt::{BlockedLine, ReservedPathLine};

use crate::body::ProxyBody;
use crate::outbound::dial;
use crate::request::record::ledger_unavailable;
use crate::request::reserved::{self, PathClass};
use crate::request::respond;
use crate::request::route::{Route, Service};
use crate::request::Leg;
use crate::Proxy;
use veris_host::Host;

impl Proxy {
    /// Transparent tier (DESIGN §7a.11): why the name the client gave —
    /// one that passes on its own say-so — cannot stand for the address its
    /// bytes were headed to, or `None` when it can (or nothing is to be
    /// checked). A loopback name (`localhost`, `*.localhost`, RFC 6761, or
    /// a loopback literal) stands only for a loopback address. An allowed
    /// name stands for the addresses it resolves to; that lookup is made in
    /// strict mode only, where it decides (in passthrough mode the bytes go
    /// to the destination either way, and the ledger names both).
    pub(crate) async fn name_mismatch(&self, leg: &Leg, route: Route<'_>) -> Option<String> {
        let dst = leg.origin?;
        let ip = dst.ip().to_canonical();
        // Isolated run: the client looked a name up and got `dst` from our
        // stub; the name it gives now must be that one.
        if let Some(looked_up) = dial::synthetic_name(ip) {
            let named = Host::new(&leg.host).into_string();
            return (!named.eq_ignore_ascii_case(&looked_up)).then(|| {
                format!(
                    "{} is not {looked_up}, the name the client looked up for {dst}",
                    leg.host
                )
            });
        }
        match route {
            Route::Loopback if !ip.is_loopback() => Some(format!(
                "{} is a loopback name but the connection was headed to {dst}",
                leg.host
            )),
            Route::Allowed if self.identity.mode == Mode::Strict => {
                let lookup = (self.resolve)(leg.host.clone(), dst.port());
                match tokio::time::timeout(self.connect_timeout, lookup).await {
                    Ok(Ok(addrs)) if addrs.iter().any(|a| a.ip().to_canonical() == ip) => None,
                    Ok(Ok(_)) => Some(format!(
                        "{} does not resolve to {ip}, where the connection was headed",
                        leg.host
                    )),
                    Ok(Err(e)) => Some(format!(
                        "{} could not be resolved to check it against {dst} ({e})",
                        leg.host
                    )),
                    Err(_) => Some(format!(
                        "{} could not be resolved within {:?} to check it against {dst}",
                        leg.host, self.connect_timeout
                    )),
                }
            }
            _ => None,
        }
    }

    /// Transparent TLS: the Host a request names must be the SNI the
    /// connection was routed by, or a client could reach one vendor's twin
    /// under another vendor's certificate. `Some` is the 502 refusal.
    pub(crate) async fn sni_host_mismatch<B>(
        &self,
        req: &Request<B>,
        leg: &Leg,
    ) -> Option<Response<ProxyBody>> {
        let named = request_host(req)?;
        let host = Host::new(&named).into_string();
        if host.eq_ignore_ascii_case(&leg.host) {
            return None;
        }
        warn!(sni = %leg.host, %host, "Host header disagrees with the TLS SNI");
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: format!("Host {host} disagrees with the TLS SNI"),
            dst: leg.headed_to(),
        }))
        .await;
        Some(respond::error(
            StatusCode::BAD_GATEWAY,
            "veris_sni_host_mismatch",
            format!(
                "the request names host {host} but the TLS connection was opened for {}. Next: send requests for {host} on a connection to {host}",
                leg.host
            ),
            json!({"sni": leg.host, "host": host}),
        ))
    }

    /// Phase 5: vendor paths the proxy answers itself and never forwards
    /// (DESIGN §7a.7): the twin's control surface sits beside every service
    /// (`…/s/{sandbox}/{service}/veris/…`), and dot-segments could be resolved
    /// out of the service's prefix. Each refusal is recorded as its own kind,
    /// never as a vendor call; `None` lets the request through.
    pub(crate) async fn screen(
        &self,
        service: &Service,
        req: &Request<Incoming>,
        leg: &Leg,
    ) -> Option<Response<ProxyBody>> {
        let (status, code, message) = match reserved::classify(req.uri().path()) {
            PathClass::Vendor => return None,
            PathClass::DotSegment => (
                StatusCode::BAD_REQUEST,
                "veris_bad_path",
                format!(
                    "the path has a `.` or `..` segment (possibly percent-encoded); veris does not forward it because the twin could resolve it outside the {} service. Next: send the resolved path (most clients resolve dot-segments themselves; curl does unless --path-as-is is given)",
                    service.name
                ),
            ),
            PathClass::Reserved => (
                StatusCode::NOT_FOUND,
                "veris_reserved_path",
                format!(
                    "paths under /veris on {} are reserved for the twin's control surface and are never forwarded. Next: call the vendor's own API paths; read what reached the twin with `veris receipt`",
                    leg.host
                ),
            ),
        };
        let entry = Entry::ReservedPath(ReservedPathLine {
            service: service.name.clone(),
            host: leg.host.clone(),
            method: req.method().to_string(),
            path: redact::text(req.uri().path()),
            status: status.as_u16(),
            error: code.to_string(),
            tier: leg.tier,
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "ledger unavailable: refusing vendor traffic until it recovers");
            return Some(ledger_unavailable(&e, &service.name));
        }
        // The request's own fields, not its span's: that span is `debug`
        // (it would be formatted for every request), and this line is read
        // at `info`, in JSON by a log collector.
        info!(
            service = %service.name,
            host = %leg.host,
            method = %req.method(),
            path = %redact::text(req.uri().path()),
            status = status.as_u16(),
            error = code,
            "reserved path answered by the proxy"
        );
        Some(respond::error(
            status,
            code,
            message,
            json!({"service": service.name}),
        ))
    }

    /// Strict mode: 421 in words, recorded as blocked.
    pub(crate) async fn refuse(&self, req: Request<Incoming>, leg: &Leg) -> Response<ProxyBody> {
        let entry = Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: "strict mode: no service claims this host and path".into(),
            dst: leg.headed_to(),
        });
        if let Err(e) = self.recorder.record(entry).await {
            warn!(error = %e, "blocked request could not be recorded");
        }
        let known: Vec<&str> = self
            .router
            .services()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        respond::json(
            StatusCode::MISDIRECTED_REQUEST,
            json!({
                "error": "veris_unmapped_host",
                "message": format!("veris is in strict mode and no service is routed for {}{}", leg.host, req.uri().path()),
                "host": leg.host,
                "remedy": [
                    format!("route it to a twin service: --route SERVICE={}", leg.host),
                    format!("or allow it through: add \"{}\" to allow_passthrough", leg.host),
                    "or run in passthrough mode (--mode passthrough)",
                ],
                "sandbox_id": self.identity.sandbox_id,
                "known_services": known,
            }),
        )
    }

    /// An isolated run's client asking for loopback through the proxy: its
    /// own loopback it reaches directly, so this can only mean the host's,
    /// which veris never reaches for it. 403, recorded as blocked.
    pub(crate) async fn refuse_host_loopback(
        &self,
        leg: &Leg,
        method: Option<String>,
        path: Option<String>,
        why: Option<String>,
    ) -> Response<ProxyBody> {
        let (reason, code) = match why {
            // The gateway's dial policy: the refusal names the address and its class.
            Some(why) if dial::policy_enforced() => (why, "veris_dial_refused"),
            _ => ("isolated run: the host's loopback and every address of its interfaces are not reachable through veris (the run's own loopback is reached directly)".to_string(), "veris_host_loopback"),
        };
        info!(
            host = %leg.host,
            port = leg.port,
            method = method.as_deref(),
            path = path.as_deref().map(redact::text),
            %reason,
            "refused a destination"
        );
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method,
            path,
            reason: reason.clone(),
            dst: leg.headed_to(),
        }))
        .await;
        let next = match code {
            "veris_dial_refused" => "Next: call a routed vendor host, or ask the gateway's operator for an --allow-dial exception",
            _ => "Next: connect to the service on the run's own loopback, or give it a routed name",
        };
        respond::error(
            StatusCode::FORBIDDEN,
            code,
            format!("{}:{} is refused: {reason}. {next}", leg.host, leg.port),
            json!({"host": leg.host}),
        )
    }

    /// Strict mode, transparent tier: a request whose Host is a loopback or
    /// allowed name but whose connection was headed elsewhere (`why`).
    /// 421 in words, recorded as blocked with that destination.
    pub(crate) async fn refuse_mismatch(
        &self,
        req: Request<Incoming>,
        leg: &Leg,
        why: String,
    ) -> Response<ProxyBody> {
        warn!(host = %leg.host, dst = ?leg.origin, "{why}; refused");
        self.record_or_log(Entry::Blocked(BlockedLine {
            host: leg.host.clone(),
            port: leg.port,
            tier: leg.tier,
            method: Some(req.method().to_string()),
            path: Some(req.uri().path().to_string()),
            reason: format!("strict mode: name does not match the destination: {why}"),
            dst: leg.headed_to(),
        }))
        .await;
        respond::json(
            StatusCode::MISDIRECTED_REQUEST,
            json!({
                "error": "veris_name_mismatch",
                "message": format!("veris is in strict mode and refuses this request: {why}"),
                "host": leg.host,
                "dst": leg.headed_to(),
                "remedy": [
                    format!("connect to an address {} stands for (loopback for a loopback name; for an allowed host, one the proxy's resolver also returns)", leg.host),
                    "or run in passthrough mode (--mode passthrough), where it is let through and recorded with its destination",
                ],
                "sandbox_id": self.identity.sandbox_id,
            }),
        )
    }

    /// The canary: proves a request went through this run's proxy. Through
    /// a gateway it is the sandbox's own proof that its egress goes there,
    /// so the answer is recorded in its ledger as a `canary` check (at most
    /// one line a second: a probe loop cannot flood the ledger).
    pub(crate) async fn canary(&self) -> Response<ProxyBody> {
        if self.identity.tier == veris_receipt::ListenerTier::Gateway
            && crate::inbound::gateway::once_a_second(&self.canary_recorded)
        {
            self.record_or_log(Entry::Check(veris_receipt::CheckLine {
                name: "canary".into(),
                status: "ok".into(),
                detail: format!(
                    "probed from inside sandbox {} through the gateway",
                    self.identity.sandbox_id
                ),
                since_seq: 0,
                until_seq: 0,
            }))
            .await;
        }
        respond::json(
            StatusCode::OK,
            json!({
                "veris_proxy": true,
                "canary": self.identity.canary,
                "run_id": self.identity.run_id,
                "sandbox_id": self.identity.sandbox_id,
                "mode": self.identity.mode,
                "tier": self.identity.tier,
            }),
        )
    }
}

/// The host a request names: its Host header, else the URI authority (HTTP/2).
pub(crate) fn request_host<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))
}
