//! The gateway tier (DESIGN §13): veris outside the sandboxes, where the
//! sandbox platform sends each sandbox's TCP egress (SOCKS5 or CONNECT with
//! the sandbox's credentials). What the tier is made of, below the runtime
//! that starts it ([`crate::runtime::gateway`]):
//!
//! - the **sandboxes** ([`Sandboxes`]): each a tenant with its own
//!   credential (the password kept only as its SHA-256, compared in
//!   constant time), read token, routes, mode, twin base, connection cap,
//!   expiry, proxy and ledger; its registration record
//!   ([`crate::tier::gateway_record`]) is what survives a restart;
//! - what a sandbox's **session line** records: the gateway tier, and the
//!   coverage that is the platform's word ([`coverage`]);
//! - the **credential check** the listener asks
//!   ([`veris_proxy::inbound::gateway::Tenants`]), whose refusals go to the
//!   gateway's own log (rate-limited), never to a sandbox's ledger.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::{bail, Result};
use subtle::ConstantTimeEq;
use tracing::warn;
use veris_proxy::inbound::gateway::Tenants;
use veris_proxy::inbound::socks5::Credentials;
use veris_proxy::Proxy;
use veris_receipt::ledger::Ledger;

/// The directory under the state dir that holds one directory per sandbox.
pub const SANDBOXES_DIR: &str = "sandboxes";

/// Whether `id` may name a sandbox: `[a-z0-9_-]{1,64}`, so it is also a
/// directory name and a NATS subject token (G2).
pub fn valid_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !ok {
        bail!("sandbox id {id:?} is not 1 to 64 of a-z, 0-9, _ and -. Next: pick an id of those characters");
    }
    Ok(())
}

/// SHA-256 of a secret: what the gateway keeps of a password.
pub fn digest(secret: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// One registered sandbox, live.
pub struct Sandbox {
    pub id: String,
    /// SHA-256 of its password (a high-entropy secret: a plain digest is
    /// enough, no password-hardening needed).
    pub password: [u8; 32],
    /// SHA-256 of its read token, which reads its receipt and ledger from
    /// the admin API, and nothing else.
    pub read_token_sha256: [u8; 32],
    pub services: Vec<String>,
    pub mode: veris_receipt::Mode,
    /// When it stops being served (`--ttl`), if ever.
    pub expires: Option<SystemTime>,
    /// The twin's newest log id per service when its session started (the
    /// start of the twin cross-check recorded when it closes).
    pub twin_heads: BTreeMap<String, u64>,
    pub proxy: Arc<Proxy>,
    pub ledger: Arc<Ledger>,
    pub admin: Arc<veris_proxy::admin::Admin>,
    /// Its seal timer.
    pub timer: tokio::task::JoinHandle<()>,
    /// Its registration as stored ([`crate::tier::gateway_record`]).
    pub record: crate::tier::gateway_record::Record,
    /// Publishing its ledger to NATS (`--nats`), on
    /// `veris.ledger.<sandbox>.<gateway>`.
    pub publishing: Option<Arc<crate::runtime::fleet::Publishing>>,
    /// Its session has ended (final seal written): at most once, and a
    /// second caller waits for the first to finish.
    pub closed: tokio::sync::Mutex<bool>,
    /// Its webhook deliveries (`--webhook`), if any.
    pub webhooks: Option<Deliveries>,
}

/// A sandbox's webhook deliveries: where the built-in twin's events for it
/// are handed, and the engine that delivers them into its ledger (taken
/// and stopped when its session ends, before its final seal); or, for an
/// external twin, its ingress (closed then).
pub struct Deliveries {
    pub events: veris_twin::webhook::EventSink,
    pub engine: tokio::sync::Mutex<Option<veris_proxy::callback::Engine>>,
    /// The ingress, when the sandbox's twin is an external one.
    pub ingress: Option<Arc<veris_proxy::callback::Ingress>>,
    /// Asks the engine for deliveries on demand (`veris trigger|replay
    /// --sandbox`), when there is an engine.
    pub control: Option<veris_proxy::callback::Control>,
}

impl Sandbox {
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|e| now >= e)
    }
}

/// Every sandbox the gateway serves, by id.
#[derive(Default)]
pub struct Sandboxes {
    by_id: RwLock<BTreeMap<String, Arc<Sandbox>>>,
    /// Refused logins since the last log line, and when that was.
    refused: AtomicU64,
    refused_logged: AtomicU64,
}

impl Sandboxes {
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.by_id.read().ok()?.get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.by_id
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Registers `sandbox`; an id already in use is refused.
    pub fn insert(&self, sandbox: Arc<Sandbox>) -> Result<()> {
        let mut map = self
            .by_id
            .write()
            .map_err(|_| anyhow::anyhow!("the sandbox table is poisoned"))?;
        if map.contains_key(&sandbox.id) {
            bail!(
                "sandbox {} is registered already. Next: pick another id (an id is served once)",
                sandbox.id
            );
        }
        map.insert(sandbox.id.clone(), sandbox);
        Ok(())
    }

    /// Takes `id` out: from now on its credential is refused.
    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.by_id.write().ok()?.remove(id)
    }

    fn refuse(&self, peer: SocketAddr, username: &str, why: &str) -> Option<Arc<Proxy>> {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.refused_logged.swap(now, Ordering::Relaxed) != now {
            self.refused.fetch_sub(n, Ordering::Relaxed);
            // The username is the client's text: quoted, bounded.
            let shown: String = username.chars().take(64).collect();
            warn!(%peer, username = ?shown, why, refused = n, "refused a sandbox credential (refusals counted since the last such line)");
        }
        None
    }
}

impl Tenants for Sandboxes {
    fn authenticate(&self, credentials: &Credentials, peer: SocketAddr) -> Option<Arc<Proxy>> {
        // Hashed before the lookup: an unknown name costs what a known one does.
        let given = digest(&credentials.password);
        let Some(sandbox) = self.get(&credentials.username) else {
            return self.refuse(peer, &credentials.username, "no such sandbox");
        };
        if !bool::from(sandbox.password.ct_eq(&given)) {
            return self.refuse(peer, &credentials.username, "wrong password");
        }
        if sandbox.expired(SystemTime::now()) {
            return self.refuse(peer, &credentials.username, "expired");
        }
        Some(sandbox.proxy.clone())
    }
}

/// What a sandbox's session line says the gateway covers: nothing veris
/// installed — the platform forces the sandbox's TCP here, its word — and
/// UDP (DNS, QUIC) is not tunneled at all.
pub fn coverage() -> veris_receipt::Coverage {
    veris_receipt::Coverage {
        tcp_ports: None,
        quic: "open".into(),
        dns: "open".into(),
        udp_other: "open".into(),
        ip_other: "open".into(),
        ipv6: true,
        exempt: Vec::new(),
        installed_by: "platform".into(),
        isolation: Some("gateway".into()),
        sockets_reachable: Vec::new(),
        bundles: Vec::new(),
        upstream_proxy: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_are_subject_tokens() {
        for ok in ["a", "sbx-1", "ci_run_42", &"x".repeat(64)] {
            assert!(valid_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "a.b",
            "a b",
            "a/b",
            "a*",
            ">",
            &"x".repeat(65),
            "é",
        ] {
            assert!(valid_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_digest_is_sha256() {
        let d = digest("abc");
        assert_eq!(
            d[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf"
        );
    }
}
