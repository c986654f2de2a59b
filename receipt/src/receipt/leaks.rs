//! Leaks: evidence-based notes on how traffic could have bypassed the proxy
//! in a window (DESIGN §7a.9, §8).

use crate::entry::SessionLine;
use crate::entry::{Coverage, Entry, ListenerTier};
use crate::ledger::LedgerRead;

use super::normalize_host;

/// Evidence-based leak notes (DESIGN §8), in a fixed order. Nothing is
/// claimed without a session line: the tier is unknown then. In the
/// transparent tier they come from the coverage the session line records,
/// never from a constant: `leaks: none` holds only for rules that send every
/// TCP port to the proxy, sink QUIC, drop other UDP, answer DNS themselves,
/// were installed and watched by veris, and a workload that is not root.
pub(super) fn leaks(read: &LedgerRead, since: u64, until: u64) -> Vec<String> {
    let mut out = Vec::new();
    let session = read
        .lines
        .iter()
        .rev()
        .filter(|l| l.seq <= until)
        .find_map(|l| match &l.entry {
            Entry::Session(SessionLine {
                tier,
                coverage,
                workload_uid,
                ..
            }) => Some((*tier, coverage.as_deref(), *workload_uid)),
            _ => None,
        });
    // An isolated run's passthroughs through an upstream proxy: it resolves
    // their names itself, so veris cannot hold it to "never this host".
    let via_upstream = session.is_some_and(|(_, c, _)| {
        c.is_some_and(|c| c.upstream_proxy && c.isolation.as_deref() == Some("netns"))
    });
    match session {
        Some((ListenerTier::Explicit, Some(c), workload_uid))
            if c.isolation.as_deref() == Some("landlock") =>
        {
            out.extend(confined_leaks(c));
            if workload_uid == Some(0) {
                out.push("workload-root".to_string());
            }
        }
        Some((ListenerTier::Explicit, _, workload_uid)) => {
            // Clients that ignore the proxy variables go straight out, and
            // nothing redirects UDP in this tier.
            out.push("direct-egress-possible".to_string());
            out.push("udp-quic-possible".to_string());
            out.push(HOST_DAEMONS.to_string());
            // Root in the host's namespaces: it can change the host, read
            // the proxy's memory, and start what outlives the run.
            if workload_uid == Some(0) {
                out.push("workload-root".to_string());
            }
        }
        Some((ListenerTier::Transparent, None, _)) => {
            out.push("coverage-unknown".to_string());
        }
        Some((ListenerTier::Transparent, Some(c), workload_uid)) => {
            out.extend(coverage_leaks(c, workload_uid));
        }
        Some((ListenerTier::Gateway, _, _)) => out.extend(GATEWAY.map(String::from)),
        None => {}
    }
    let changed = read.lines.iter().any(|l| {
        l.seq > since && l.seq <= until && matches!(l.entry, Entry::RedirectChange { .. })
    });
    if changed {
        out.push("redirect-changed".to_string());
    }
    // Open egress, evidenced by tunnels in the window: an ECH client shows
    // only its public front name, so a tunnel may hide its real destination.
    // (The transparent tier's kernel rules send UDP 443 to the proxy's silent
    // QUIC sink, which records each attempt as a `quic` line: see below.)
    let tunnels = read
        .lines
        .iter()
        .any(|l| l.seq > since && l.seq <= until && matches!(l.entry, Entry::Passthrough(_)));
    if tunnels {
        out.push("ech-possible".to_string());
        if via_upstream {
            out.push("upstream-proxy-resolves-names".to_string());
        }
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
        // The SNI is the workload's text: quoted (DESIGN §7a.17).
        let hosts: Vec<String> = ech_hosts.iter().map(|h| crate::quote::quoted(h)).collect();
        out.push(format!("ech-observed {}", hosts.join(",")));
    }
    let udp_dropped: u64 = read
        .lines
        .iter()
        .filter(|l| l.seq > since && l.seq <= until)
        .map(|l| match l.entry {
            Entry::UdpDropped { packets } => packets,
            _ => 0,
        })
        .sum();
    if udp_dropped > 0 {
        out.push(format!("udp-dropped {udp_dropped}"));
    }
    if quic_attempts > 0 {
        // The SNI read from the decrypted Initial, when the sink could read it.
        quic_hosts.sort();
        out.push(if quic_hosts.is_empty() {
            format!("quic-attempts {quic_attempts}")
        } else {
            let hosts: Vec<String> = quic_hosts.iter().map(|h| crate::quote::quoted(h)).collect();
            format!("quic-attempts {quic_attempts} ({})", hosts.join(","))
        });
    }
    out
}

/// What Landlock's confinement of an explicit-tier child leaves open: it
/// filters TCP `connect()` by port only, so the proxy's port on any host
/// stays reachable; a TCP Fast Open `sendto` and an MPTCP socket are not
/// seen by its connect hook (kernel 6.18, measured); and it does not cover
/// UDP or ICMP at all.
fn confined_leaks(c: &Coverage) -> Vec<String> {
    let mut out = vec![
        "tcp-proxy-port-any-host".to_string(),
        "tcp-fastopen-mptcp-open".to_string(),
    ];
    out.extend(open_channels(c));
    out.push(HOST_DAEMONS.to_string());
    out
}

/// What a gateway cannot see from outside the sandbox, whatever its
/// session line says: the gateway proves what passed through it; that the
/// platform sent all of the sandbox's TCP there is the platform's word (a
/// canary probe shows the route is used, not that nothing goes around it),
/// and SOCKS5/CONNECT platforms do not tunnel UDP, so DNS and QUIC leave the
/// sandbox as the platform allows. The sandbox runs on the platform's
/// hosts, not this one: the uid and host notes of the other tiers do not
/// apply.
const GATEWAY: [&str; 2] = ["platform-enforced", "udp-not-tunneled"];

/// The explicit and confined tiers run the command in the host's
/// namespaces, where it can ask a daemon of its uid that is already running
/// (a tmux server, `systemd --user`, `atd`) to start a process: that process
/// is no descendant of `veris run`, so it is neither confined nor ended with
/// the run, and it may go around the proxy or outlive the receipt.
const HOST_DAEMONS: &str = "host-daemon-escape-possible";

/// The channels besides TCP that a coverage leaves open: QUIC, other UDP,
/// ICMP echo or raw IP, and queries to a real resolver — each can carry
/// data out by itself.
fn open_channels(c: &Coverage) -> Vec<String> {
    let open = [
        (c.quic != "sink", "udp-quic-possible"),
        (c.udp_other != "dropped", "udp-other-open"),
        (c.ip_other != "dropped", "ip-other-open"),
        (c.dns != "stub" && c.dns != "none", "dns-egress"),
    ];
    open.iter()
        .filter(|(is_open, _)| *is_open)
        .map(|(_, note)| note.to_string())
        .collect()
}

/// What the recorded rules leave open.
fn coverage_leaks(c: &Coverage, workload_uid: Option<u32>) -> Vec<String> {
    let mut out = Vec::new();
    if c.installed_by != "veris" {
        // Rules veris did not install it cannot inspect or watch.
        out.push("coverage-unverified".to_string());
    }
    if c.tcp_ports.is_some() {
        out.push("tcp-other-ports-open".to_string());
    }
    out.extend(open_channels(c));
    if !c.ipv6 {
        out.push("ipv6-open".to_string());
    }
    // Root can rewrite the rules, run as the proxy uid or set its mark. An
    // isolated child can do none of that, whatever its uid (it holds no
    // capability, and its namespace has no interface but loopback), but as
    // uid 0 it still writes the host's own files — cron jobs, binaries,
    // veris itself — for a host process to act on after the run.
    if !c.sockets_reachable.is_empty() {
        // Unix sockets are paths, which a network namespace does not
        // separate: a host daemon listening in one of these is reachable.
        out.push(format!(
            "host-sockets-reachable ({})",
            c.sockets_reachable.join(", ")
        ));
    }
    let marked = c.exempt.iter().any(|e| e.starts_with("mark"));
    if workload_uid.is_none_or(|u| u == 0) || marked {
        out.push("workload-root".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coverage() -> Coverage {
        Coverage {
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
        }
    }

    #[test]
    fn leaks_come_from_the_recorded_coverage() {
        assert!(coverage_leaks(&coverage(), Some(1000)).is_empty());
        assert_eq!(coverage_leaks(&coverage(), None), ["workload-root"]);
        assert_eq!(coverage_leaks(&coverage(), Some(0)), ["workload-root"]);
        let mut narrow = coverage();
        narrow.tcp_ports = Some(vec![80, 443]);
        narrow.quic = "open".into();
        narrow.dns = "resolvers".into();
        assert_eq!(
            coverage_leaks(&narrow, Some(1000)),
            ["tcp-other-ports-open", "udp-quic-possible", "dns-egress"]
        );
        let mut external = coverage();
        external.installed_by = "external".into();
        external.exempt.push("mark 0x76657269".into());
        assert_eq!(
            coverage_leaks(&external, Some(1000)),
            ["coverage-unverified", "workload-root"]
        );
        // An isolated child holds no capability, but as root it writes the
        // host's files.
        let isolated = Coverage {
            exempt: Vec::new(),
            isolation: Some("netns".into()),
            ..coverage()
        };
        assert!(coverage_leaks(&isolated, Some(1000)).is_empty());
        // Home directories are not separated: an isolated run says so.
        let isolated = Coverage {
            sockets_reachable: vec!["home directories".into()],
            ..isolated
        };
        assert_eq!(
            coverage_leaks(&isolated, Some(1000)),
            ["host-sockets-reachable (home directories)"]
        );
        assert_eq!(
            coverage_leaks(&isolated, Some(0)),
            ["host-sockets-reachable (home directories)", "workload-root"]
        );
    }

    #[test]
    fn landlock_names_what_it_cannot_cover() {
        let confined = Coverage {
            quic: "open".into(),
            dns: "open".into(),
            udp_other: "open".into(),
            ip_other: "open".into(),
            exempt: Vec::new(),
            isolation: Some("landlock".into()),
            ..coverage()
        };
        assert_eq!(
            confined_leaks(&confined),
            [
                "tcp-proxy-port-any-host",
                "tcp-fastopen-mptcp-open",
                "udp-quic-possible",
                "udp-other-open",
                "ip-other-open",
                "dns-egress",
                "host-daemon-escape-possible"
            ]
        );
    }

    /// A gateway proves what passed through it: that nothing went around
    /// it, and what UDP did, is the platform's word, whatever the session
    /// line records of uids or coverage; open egress still shows.
    #[test]
    fn a_gateway_says_what_is_the_platforms_word() {
        use crate::entry::{Line, PassthroughLine};
        let line = |seq, entry| Line {
            v: 5,
            seq,
            ts: String::new(),
            entry,
            prev: String::new(),
        };
        let gateway = Coverage {
            exempt: Vec::new(),
            installed_by: "platform".into(),
            isolation: Some("gateway".into()),
            ..coverage()
        };
        for (coverage, workload_uid) in [(Some(Box::new(gateway)), None), (None, Some(0))] {
            let mut read = LedgerRead::default();
            read.lines.push(line(
                1,
                Entry::Session(SessionLine {
                    tier: ListenerTier::Gateway,
                    coverage,
                    workload_uid,
                    ..SessionLine::test()
                }),
            ));
            assert_eq!(
                leaks(&read, 0, 1),
                ["platform-enforced", "udp-not-tunneled"]
            );
            read.lines.push(line(
                2,
                Entry::Passthrough(PassthroughLine {
                    tier: ListenerTier::Gateway,
                    ..PassthroughLine::test("example.org")
                }),
            ));
            assert_eq!(
                leaks(&read, 0, 2),
                ["platform-enforced", "udp-not-tunneled", "ech-possible"]
            );
        }
    }
}
