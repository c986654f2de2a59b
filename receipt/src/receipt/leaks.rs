//! Leaks: evidence-based notes on how traffic could have bypassed the proxy
//! in a window (DESIGN §7a.9, §8).

use crate::entry::{Entry, ListenerTier};
use crate::ledger::LedgerRead;

use super::normalize_host;

/// Evidence-based leak notes (DESIGN §8), in a fixed order. Nothing is
/// claimed without a session line: the tier is unknown then.
pub(super) fn leaks(
    read: &LedgerRead,
    since: u64,
    until: u64,
    tier: Option<ListenerTier>,
) -> Vec<String> {
    let mut out = Vec::new();
    if tier == Some(ListenerTier::Explicit) {
        // Clients that ignore the proxy variables go straight out, and
        // nothing redirects UDP in this tier.
        out.push("direct-egress-possible".to_string());
        out.push("udp-quic-possible".to_string());
    }
    // Open egress, evidenced by tunnels in the window: an ECH client shows
    // only its public front name, so a tunnel may hide its real destination.
    // (The transparent tier's kernel rules send UDP 443 to the proxy's silent
    // QUIC sink, which records each attempt as a `quic` line: see below.)
    let tunnels = read
        .lines
        .iter()
        .any(|l| l.seq > since && l.seq <= until && matches!(l.entry, Entry::Passthrough { .. }));
    if tunnels {
        out.push("ech-possible".to_string());
    }
    let mut ech_hosts: Vec<String> = Vec::new();
    let mut quic_attempts: u64 = 0;
    let mut quic_hosts: Vec<String> = Vec::new();
    for line in read
        .lines
        .iter()
        .filter(|l| l.seq > since && l.seq <= until)
    {
        match &line.entry {
            Entry::Ech { host, .. } => {
                let host = normalize_host(host);
                if !ech_hosts.contains(&host) {
                    ech_hosts.push(host);
                }
            }
            Entry::Quic { attempts, host, .. } => {
                quic_attempts = quic_attempts.saturating_add(*attempts);
                if let Some(host) = host.as_deref().map(normalize_host) {
                    if !quic_hosts.contains(&host) {
                        quic_hosts.push(host);
                    }
                }
            }
            _ => {}
        }
    }
    if !ech_hosts.is_empty() {
        ech_hosts.sort();
        out.push(format!("ech-observed {}", ech_hosts.join(",")));
    }
    if quic_attempts > 0 {
        // The SNI read from the decrypted Initial, when the sink could read it.
        quic_hosts.sort();
        out.push(if quic_hosts.is_empty() {
            format!("quic-attempts {quic_attempts}")
        } else {
            format!("quic-attempts {quic_attempts} ({})", quic_hosts.join(","))
        });
    }
    out
}
