//! The transparent tier's process side: its flags, the nftables rules that
//! redirect every outbound TCP connection of the workload to our listeners,
//! UDP 443 to the QUIC sink, DNS only to the configured resolvers and drop
//! every other datagram (installed with the `nft` command from the ruleset in
//! `deploy/veris.nft`), what those rules cover (recorded in the session line,
//! the receipt's leaks come from it), and dropping root for the proxy uid
//! before any client byte is read.
//!
//! A small root helper stays behind while the proxy runs: it watches `table
//! inet veris` (`nft monitor`) and reports every change, and the UDP drop
//! counter, on a pipe the proxy records from. It removes the rules only when
//! the proxy says so at a clean shutdown; if the proxy dies, the rules stay
//! and fail closed (redirected connections find no listener and are refused,
//! other datagrams stay dropped).
//!
//! Rootless mode: as uid 0 of a user namespace that maps no other uid (what
//! `unshare -rn` gives an unprivileged user), there is no proxy uid to drop
//! to and the workload is uid 0 as well, so the uid exemption cannot tell
//! them apart. There veris keeps its (namespace-only) privileges, checks
//! that it can mark its own dials (`SO_MARK`, exempted by the ruleset's
//! `meta mark` rule) and relies on that mark instead. Detected from
//! /proc/self/uid_map; the real-root path is unchanged.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::future::BoxFuture;
use tracing::{info, warn};

use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use veris_proxy::Proxy;
use veris_receipt::ledger::Ledger;
use veris_receipt::Entry;

use super::{Bound, Ran, Tier, Workload};

/// The ruleset, templated (see [`ruleset`] and the file's header).
pub const RULESET_TEMPLATE: &str = include_str!("../../deploy/veris.nft");

/// Name of the nftables table (family inet) the rules live in.
pub const TABLE: &str = "veris";

/// Default uid the proxy runs as in the transparent tier (DESIGN §4).
pub const DEFAULT_PROXY_UID: u32 = 14741;

#[derive(Args, Clone, Debug)]
pub struct TransparentArgs {
    /// Also accept connections redirected by nftables (transparent tier).
    #[arg(long)]
    pub transparent: bool,
    /// Listener for redirected TLS (TCP 443).
    #[arg(long, value_name = "ADDR", default_value = "[::]:8443")]
    pub https_listen: String,
    /// Listener for redirected plain HTTP (TCP 80).
    #[arg(long, value_name = "ADDR", default_value = "[::]:8081")]
    pub http_listen: String,
    /// Uid the proxy runs as; the redirect exempts it, so it must not be the workload's.
    #[arg(long, value_name = "UID", default_value_t = DEFAULT_PROXY_UID)]
    pub proxy_uid: u32,
    /// The workload's uid, when known: refused if it equals --proxy-uid.
    #[arg(long, value_name = "UID")]
    pub workload_uid: Option<u32>,
    /// As root: install the nftables redirect, then drop to --proxy-uid.
    #[arg(long, requires = "transparent", conflicts_with = "redirect_external")]
    pub install_redirect: bool,
    /// The redirect was installed by someone else (boot script, image).
    #[arg(long, requires = "transparent")]
    pub redirect_external: bool,
    /// Do not redirect UDP 443 (QUIC) to the sink in the installed rules
    /// (nor start the sink).
    #[arg(long)]
    pub allow_quic: bool,
    /// Sink for redirected UDP 443 (QUIC): never answers, records each attempt.
    #[arg(long, value_name = "ADDR", default_value = veris_proxy::inbound::quic::DEFAULT_QUIC_LISTEN)]
    pub quic_listen: String,
    /// Redirect only these TCP ports (default: every port). Narrower rules
    /// show in the receipt's leaks (`tcp-other-ports-open`).
    #[arg(long, value_delimiter = ',', value_name = "PORT,...")]
    pub egress_ports: Vec<u16>,
}

/// What goes into the ruleset.
#[derive(Debug, Clone)]
pub struct RulesetParams {
    /// The proxy's uid, exempt from the redirect; `None` in an isolated run,
    /// where the proxy lives outside the namespace and nothing in it is exempt.
    pub proxy_uid: Option<u32>,
    pub https_port: u16,
    pub http_port: u16,
    pub quic_port: u16,
    pub allow_quic: bool,
    /// TCP ports redirected; empty: every port.
    pub egress_ports: Vec<u16>,
    /// The proxy's own dials are told apart by mark (rootless namespace).
    pub exempt_mark: bool,
    /// Resolvers DNS may reach.
    pub resolvers: Vec<std::net::IpAddr>,
    /// Isolated run: every DNS query goes to veris's stub at these ports
    /// (UDP, TCP) instead of any resolver.
    pub dns_stub: Option<(u16, u16)>,
}

impl RulesetParams {
    /// What these rules send to the proxy, for the session line.
    pub fn coverage(&self, installed_by: &str) -> veris_receipt::Coverage {
        let mut exempt: Vec<String> = self
            .proxy_uid
            .map(|u| format!("uid {u}"))
            .into_iter()
            .collect();
        if self.exempt_mark {
            exempt.push(format!(
                "mark {:#x}",
                veris_proxy::outbound::dial::EXEMPT_MARK
            ));
        }
        veris_receipt::Coverage {
            tcp_ports: (!self.egress_ports.is_empty()).then(|| self.egress_ports.clone()),
            quic: if self.allow_quic { "open" } else { "sink" }.into(),
            dns: if self.dns_stub.is_some() {
                "stub"
            } else if self.resolvers.is_empty() {
                "none"
            } else {
                "resolvers"
            }
            .into(),
            udp_other: "dropped".into(),
            ip_other: "dropped".into(),
            ipv6: true,
            exempt,
            sockets_reachable: Vec::new(),
            bundles: Vec::new(),
            upstream_proxy: false,
            installed_by: installed_by.into(),
            isolation: None,
        }
    }
}

/// The nameservers of `/etc/resolv.conf` (of this mount namespace).
pub fn resolvers() -> Vec<std::net::IpAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| parse_resolvers(&t))
        .unwrap_or_default()
}

fn parse_resolvers(text: &str) -> Vec<std::net::IpAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().split('%').next()?.parse().ok())
        .collect()
}

/// The ruleset for these parameters: placeholders filled, tagged lines kept
/// only where their tag applies (see `deploy/veris.nft`).
pub fn ruleset(p: &RulesetParams) -> String {
    let v4: Vec<String> = p
        .resolvers
        .iter()
        .filter(|a| a.is_ipv4())
        .map(|a| a.to_string())
        .collect();
    let v6: Vec<String> = p
        .resolvers
        .iter()
        .filter(|a| a.is_ipv6())
        .map(|a| a.to_string())
        .collect();
    let tcp_ports = if p.egress_ports.is_empty() {
        "0-65535".to_string()
    } else {
        p.egress_ports
            .iter()
            .map(|port| port.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let keep = |line: &str| {
        let tag = line.trim_end().rsplit_once(" # ").map(|(_, t)| t);
        match tag {
            Some("quic") => !p.allow_quic,
            Some("allowquic") => p.allow_quic,
            Some("mark") => p.exempt_mark,
            Some("uid") => p.proxy_uid.is_some(),
            Some("dnsstub") => p.dns_stub.is_some(),
            Some("dns4") => !v4.is_empty(),
            Some("dns6") => !v6.is_empty(),
            Some("http") => p.egress_ports.is_empty() || p.egress_ports.contains(&80),
            _ => true,
        }
    };
    let (dns_udp, dns_tcp) = p.dns_stub.unwrap_or((0, 0));
    let mut out = String::new();
    for line in RULESET_TEMPLATE.lines().filter(|l| keep(l)) {
        out.push_str(
            &line
                .replace("@PROXY_UID@", &p.proxy_uid.unwrap_or(0).to_string())
                .replace("@DNS_UDP_PORT@", &dns_udp.to_string())
                .replace("@DNS_TCP_PORT@", &dns_tcp.to_string())
                .replace("@HTTPS_PORT@", &p.https_port.to_string())
                .replace("@HTTP_PORT@", &p.http_port.to_string())
                .replace("@QUIC_PORT@", &p.quic_port.to_string())
                .replace("@TCP_PORTS@", &tcp_ports)
                .replace("@RESOLVERS4@", &v4.join(", "))
                .replace("@RESOLVERS6@", &v6.join(", ")),
        );
        out.push('\n');
    }
    out
}

/// Rules this process installed, and the root helper that watches them and
/// removes them at a clean shutdown ([`Redirect::remove`]). Dropped without
/// `remove` (a crash, a kill), the rules stay and fail closed.
pub struct Redirect {
    stdin: Option<ChildStdin>,
    stdout: Option<std::process::ChildStdout>,
    helper: Child,
    pub params: RulesetParams,
    /// Set once clients are served: from then on only a clean shutdown
    /// removes the rules. A start that fails before it takes them back out.
    serving: bool,
}

/// The helper, as root: reports changes to the table and the UDP drop
/// counter on stdout (`change <nft monitor line>`, `udp_dropped <total>`),
/// and on its stdin waits for `remove` (then deletes the table) or end of
/// file (the proxy died: the rules stay, failing closed). It runs in its own
/// process group so a terminal's ^C reaches the proxy, not the helper.
const HELPER: &str = r#"
nft monitor 2>/dev/null | while IFS= read -r line; do
  case "$line" in *"inet veris"*) printf 'change %s\n' "$line" ;; esac
done &
last=0
while :; do
  n=$(nft list counter inet veris udp_dropped 2>/dev/null | sed -n 's/.*packets \([0-9][0-9]*\).*/\1/p')
  if [ -n "$n" ] && [ "$n" != "$last" ]; then printf 'udp_dropped %s\n' "$n"; last=$n; fi
  sleep 1
done &
read -r cmd
trap '' TERM
kill -TERM 0 2>/dev/null
if [ "$cmd" = remove ]; then exec nft delete table inet veris; fi
exit 0
"#;

impl Redirect {
    /// Records what the helper reports, from now on: a rule change as a
    /// `redirect_change` line (the receipt of that window fails), new UDP
    /// drops as `udp_dropped`. A thread, since the pipe is blocking.
    pub fn watch(&mut self, ledger: std::sync::Arc<veris_receipt::ledger::Ledger>) {
        let Some(stdout) = self.stdout.take() else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("veris-redirect-watch".into())
            .spawn(move || {
                use std::io::BufRead as _;
                let mut dropped_before = 0u64;
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    let entry = if let Some(change) = line.strip_prefix("change ") {
                        warn!(change, "the nftables redirect changed while the proxy ran");
                        veris_receipt::Entry::RedirectChange {
                            detail: change.chars().take(512).collect(),
                        }
                    } else if let Some(n) = line.strip_prefix("udp_dropped ") {
                        let Ok(total) = n.trim().parse::<u64>() else {
                            continue;
                        };
                        let new = total.saturating_sub(dropped_before);
                        dropped_before = total;
                        if new == 0 {
                            continue;
                        }
                        veris_receipt::Entry::UdpDropped { packets: new }
                    } else {
                        continue;
                    };
                    if let Err(e) = ledger.append(entry) {
                        warn!(error = %e, "cannot record what the redirect helper reported");
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot watch the redirect helper");
        }
    }

    /// Clients are served from now on: dropped without [`Redirect::remove`],
    /// the rules stay and fail closed.
    pub fn serving(&mut self) {
        self.serving = true;
    }

    /// Removes the rules (a clean shutdown) and waits (bounded) until they are gone.
    pub fn remove(mut self) {
        self.remove_now();
    }

    fn remove_now(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"remove\n");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.helper.try_wait() {
                Ok(Some(status)) => {
                    if status.success() {
                        info!("removed the nftables redirect");
                    } else {
                        warn!(%status, "removing the nftables redirect failed. Next: `nft delete table inet {TABLE}` as root");
                    }
                    return;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    warn!("the nftables redirect was not removed within 5 s. Next: `nft delete table inet {TABLE}` as root");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "cannot wait for the redirect helper");
                    return;
                }
            }
        }
    }
}

impl Drop for Redirect {
    fn drop(&mut self) {
        if self.stdin.is_none() {
            return;
        }
        if !self.serving {
            // The start failed before any client was served: nothing to
            // fail closed about.
            self.remove_now();
            return;
        }
        // Not a clean shutdown: the helper keeps the rules (fail closed).
        self.stdin = None;
        warn!("leaving the nftables redirect in place: redirected connections are refused until `nft delete table inet {TABLE}`");
    }
}

/// The transparent tier (`serve --transparent`): listeners for what the
/// host's nftables rules redirect, the rules when veris installs them, and
/// the helper that watches them.
pub struct Transparent {
    args: TransparentArgs,
    redirect: Option<Redirect>,
}

impl Transparent {
    pub fn new(args: TransparentArgs) -> Transparent {
        Transparent {
            args,
            redirect: None,
        }
    }
}

impl Tier for Transparent {
    fn preflight(&self) -> Result<()> {
        preflight(&self.args)
    }

    /// The listeners, then the rules (as root) that send traffic to them,
    /// before the session line, which records what they cover.
    fn bind(&mut self) -> BoxFuture<'_, Result<Bound>> {
        Box::pin(async move {
            let Some(listeners) = bind(&self.args).await? else {
                return Ok(Bound::default());
            };
            let https = listeners.https.local_addr()?;
            let http = listeners.http.local_addr()?;
            let quic = listeners
                .quic
                .as_ref()
                .map(|q| q.local_addr())
                .transpose()?;
            self.redirect = install_redirect(&self.args, https, http, quic)?;
            Ok(Bound {
                listeners: Some(listeners),
                coverage: coverage(&self.args, self.redirect.as_ref()),
                redirected: Some((https, http)),
                app_dialer: None,
            })
        })
    }

    fn announced(&mut self, owned_dirs: &[&Path]) -> Result<()> {
        drop_privileges(&self.args, owned_dirs)
    }

    fn serving(&mut self, ledger: &std::sync::Arc<veris_receipt::ledger::Ledger>) {
        if let Some(r) = self.redirect.as_mut() {
            // The helper's reports wait in its pipe until now.
            r.watch(ledger.clone());
            r.serving();
        }
    }

    fn run<'a>(&'a mut self, _: Workload<'a>) -> BoxFuture<'a, Result<Ran>> {
        Box::pin(async { Err(only_for_serve("run")) })
    }

    /// Removes the rules, waiting (bounded) for the root helper.
    fn teardown(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            if let Some(redirect) = self.redirect {
                let _ = tokio::task::spawn_blocking(move || redirect.remove()).await;
            }
        })
    }
}

/// The error for `--transparent` on a command that runs its own workload:
/// that workload would inherit the proxy uid, which the redirect exempts.
pub fn only_for_serve(command: &str) -> anyhow::Error {
    anyhow::anyhow!("--transparent is for `veris serve`: `veris {command}` would run its command as the proxy uid, which the redirect exempts. Next: start `veris serve --transparent --install-redirect` (or deploy/veris-boot.sh) and run the workload as another uid")
}

/// Checks the flags before anything is bound: the proxy uid must not be the
/// workload's, and the privileges must fit the chosen redirect.
pub fn preflight(args: &TransparentArgs) -> Result<()> {
    if !args.transparent {
        return Ok(());
    }
    if args.proxy_uid == 0 {
        bail!("--proxy-uid 0 would exempt every root process from the redirect, the workload included. Next: pick a dedicated uid (default {DEFAULT_PROXY_UID})");
    }
    if args.workload_uid == Some(args.proxy_uid) {
        bail!("the workload uid equals --proxy-uid {}: its traffic would be exempt from the redirect. Next: run the workload as another uid or pick another --proxy-uid", args.proxy_uid);
    }
    let euid = crate::os::prctl::euid();
    if (args.install_redirect || args.redirect_external) && rootless_namespace() {
        // Nothing else would exempt our passthrough dials: without the mark
        // they would loop back to our own listeners.
        veris_proxy::outbound::dial::check_mark().context("rootless namespace (uid 0 is the only uid mapped): veris cannot mark its own dials (SO_MARK), and the uid exemption cannot tell it from the workload. Next: run it in a network namespace owned by its user namespace (`unshare -rn`), or as real root")?;
    }
    if args.install_redirect && euid != 0 {
        bail!("--install-redirect needs root to install nftables rules (running as uid {euid}). Next: start veris as root (it drops to --proxy-uid {}) or install deploy/veris.nft yourself and pass --redirect-external", args.proxy_uid);
    }
    if args.install_redirect {
        // Checked again when installing; here so nothing is started in vain.
        refuse_existing_table()?;
    }
    if args.redirect_external && euid != 0 && euid != args.proxy_uid {
        bail!("with --redirect-external veris must run as the exempt proxy uid {} (running as uid {euid}), or its own passthrough dials are redirected back to it. Next: start it as uid {} (or as root, and it drops privileges)", args.proxy_uid, args.proxy_uid);
    }
    Ok(())
}

/// Installs the rules (as root) and starts their helper, before privileges
/// drop ([`drop_privileges`]) and before any client byte is read.
pub fn install_redirect(
    args: &TransparentArgs,
    https: SocketAddr,
    http: SocketAddr,
    quic: Option<SocketAddr>,
) -> Result<Option<Redirect>> {
    if !args.install_redirect {
        return Ok(None);
    }
    let params = RulesetParams {
        proxy_uid: Some(args.proxy_uid),
        https_port: https.port(),
        http_port: http.port(),
        quic_port: quic.map_or(0, |q| q.port()),
        allow_quic: args.allow_quic,
        egress_ports: args.egress_ports.clone(),
        exempt_mark: rootless_namespace(),
        resolvers: resolvers(),
        dns_stub: None,
    };
    install(params).map(Some)
}

/// Hands the state to the proxy uid and drops root (not in a rootless
/// namespace, where uid 0 is all there is and the mark exempts our dials).
pub fn drop_privileges(args: &TransparentArgs, owned_dirs: &[&Path]) -> Result<()> {
    if (args.install_redirect || args.redirect_external) && rootless_namespace() {
        info!(
            mark = %format_args!("{:#x}", veris_proxy::outbound::dial::EXEMPT_MARK),
            "rootless namespace: keeping uid 0 (the only uid mapped); own dials are exempt by mark"
        );
    } else if crate::os::prctl::euid() == 0 && (args.install_redirect || args.redirect_external) {
        let gid = primary_gid(args.proxy_uid);
        for dir in owned_dirs {
            crate::tier::handover::hand_over(dir, args.proxy_uid, gid)
                .with_context(|| format!("handing {} to uid {}", dir.display(), args.proxy_uid))?;
        }
        crate::os::uid::drop_to(args.proxy_uid, gid).context("dropping privileges")?;
        info!(
            uid = args.proxy_uid,
            gid, "dropped root; serving as the proxy uid"
        );
    } else if crate::os::prctl::euid() == 0 {
        warn!("transparent listeners run as root without a redirect from veris: make sure the rules exempt root, or pass --install-redirect");
    }
    Ok(())
}

/// What the session line says the redirect covers: what this process
/// installed, or, for `--redirect-external`, the operator's rules, which
/// veris cannot inspect (the receipt says `coverage-unverified`).
pub fn coverage(
    args: &TransparentArgs,
    redirect: Option<&Redirect>,
) -> Option<veris_receipt::Coverage> {
    match redirect {
        Some(r) => Some(r.params.coverage("veris")),
        None if args.redirect_external => Some(
            RulesetParams {
                proxy_uid: Some(args.proxy_uid),
                https_port: 0,
                http_port: 0,
                quic_port: 0,
                allow_quic: args.allow_quic,
                egress_ports: args.egress_ports.clone(),
                exempt_mark: rootless_namespace(),
                resolvers: resolvers(),
                dns_stub: None,
            }
            .coverage("external"),
        ),
        None => None,
    }
}

fn install(params: RulesetParams) -> Result<Redirect> {
    refuse_existing_table()?;
    let rules = ruleset(&params);
    let mut nft = Command::new(crate::os::tool::tool("nft"))
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `nft -f -`")?;
    if let Some(mut stdin) = nft.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .context("writing the ruleset to nft")?;
    }
    let out = nft.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        bail!(
            "nft refused the ruleset: {}. Next: check that the kernel has nf_tables with nat support",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    use std::os::unix::process::CommandExt as _;
    let spawned = Command::new("sh")
        .args(["-c", HELPER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let mut helper = match spawned {
        Ok(helper) => helper,
        Err(e) => {
            // Without the helper nobody would watch or remove the rules.
            let _ = Command::new(crate::os::tool::tool("nft"))
                .args(["delete", "table", "inet", TABLE])
                .status();
            return Err(e).context("starting the redirect helper");
        }
    };
    let (stdin, stdout) = (helper.stdin.take(), helper.stdout.take());
    info!(
        proxy_uid = ?params.proxy_uid,
        https_port = params.https_port,
        http_port = params.http_port,
        quic_port = params.quic_port,
        quic_redirected = !params.allow_quic,
        egress_ports = ?params.egress_ports,
        "installed the nftables redirect (table inet {TABLE})"
    );
    Ok(Redirect {
        stdin,
        stdout,
        helper,
        params,
        serving: false,
    })
}

/// Rules this process did not install are never taken over (nor removed later).
fn refuse_existing_table() -> Result<()> {
    let exists = Command::new(crate::os::tool::tool("nft"))
        .args(["list", "table", "inet", TABLE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running `nft`. Next: install nftables (apt-get install nftables)")?;
    if exists.success() {
        bail!("nftables table inet {TABLE} already exists: someone else installed a redirect. Next: pass --redirect-external to use it, or remove it with `nft delete table inet {TABLE}`");
    }
    Ok(())
}

/// True as uid 0 of a user namespace mapping no other uid (`unshare -r`):
/// see the module comment. The initial namespace maps every uid.
fn rootless_namespace() -> bool {
    crate::os::prctl::euid() == 0
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| maps_only_root(&m))
}

/// A uid_map whose one line maps uid 0 and nothing else.
fn maps_only_root(uid_map: &str) -> bool {
    let lines: Vec<Vec<&str>> = uid_map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| !f.is_empty())
        .collect();
    matches!(lines.as_slice(), [l] if l.len() == 3 && l[0] == "0" && l[2] == "1")
}

/// The uid's primary group from /etc/passwd; the uid itself when it has no entry.
fn primary_gid(uid: u32) -> u32 {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 3 && f[2].parse() == Ok(uid))
                    .then(|| f[3].parse().ok())
                    .flatten()
            })
        })
        .unwrap_or(uid)
}

/// `serve --transparent`'s listeners, bound before privileges drop.
pub async fn bind(t: &TransparentArgs) -> Result<Option<super::TransparentListeners>> {
    if !t.transparent {
        return Ok(None);
    }
    let https = tokio::net::TcpListener::bind(&t.https_listen).await.with_context(|| {
        format!("binding the transparent TLS listener to {}. Next: pick a free address with --https-listen", t.https_listen)
    })?;
    let http = tokio::net::TcpListener::bind(&t.http_listen).await.with_context(|| {
        format!("binding the transparent HTTP listener to {}. Next: pick a free address with --http-listen", t.http_listen)
    })?;
    let quic = if t.allow_quic {
        None
    } else {
        Some(tokio::net::UdpSocket::bind(&t.quic_listen).await.with_context(|| {
            format!("binding the QUIC sink (UDP) to {}. Next: pick a free address with --quic-listen, or pass --allow-quic", t.quic_listen)
        })?)
    };
    Ok(Some(super::TransparentListeners {
        https,
        http,
        quic,
        dns: None,
    }))
}

/// Serves the transparent listeners and the QUIC sink in one task: stopping
/// them also writes the sink's pending attempts, before the final seal.
pub fn serve(
    listeners: super::TransparentListeners,
    proxy: Arc<Proxy>,
    ledger: Arc<Ledger>,
    stop: &watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    let tcp = veris_proxy::inbound::transparent::serve(
        Some(listeners.https),
        Some(listeners.http),
        proxy.clone(),
        crate::util::until(stop),
    );
    let recorder: Arc<dyn veris_proxy::request::recorder::Recorder> = ledger.clone();
    let stop_sink = crate::util::until(stop);
    let sink = async move {
        match listeners.quic {
            Some(socket) => veris_proxy::inbound::quic::serve(socket, recorder, stop_sink).await,
            None => Ok(()),
        }
    };
    let dns = listeners.dns.map(|(udp, tcp)| {
        use veris_proxy::inbound::dns;
        use veris_proxy::request::route::Route;
        // Vendor, allowed and canary names resolve even once a flood of
        // made-up names filled the table.
        // Weak: the table outlives the session (dials look names up in it).
        let router = Arc::downgrade(&proxy);
        let routed: dns::Routed = Box::new(move |name: &str| {
            router.upgrade().is_some_and(|p| {
                matches!(
                    p.router().route_connection(name),
                    Route::Service(_) | Route::Allowed | Route::Canary
                )
            })
        });
        let names = Arc::new(dns::Names::new(dns::DEFAULT_CAPACITY).routing(routed));
        // Dials to the stub's addresses go to the names they stand for.
        veris_proxy::outbound::dial::answer_synthetic_with(names.clone());
        let counted = names.clone();
        let record: dns::OnLookup = Arc::new(move |lookup: &dns::Lookup| {
            if lookup.refused {
                // The first refusals are said: the receipt then names the
                // stub, not the code, for a name that did not resolve.
                if counted.refused() > veris_receipt::entry::DNS_REFUSED_LINES {
                    return;
                }
                warn!(name = %veris_receipt::quote::quoted(&lookup.name), "the DNS stub's table of names is full: a lookup was refused (SERVFAIL)");
            } else if !lookup.first {
                return;
            }
            let entry = Entry::Dns {
                name: lookup.name.clone(),
                qtype: qtype_name(lookup.qtype),
                refused: lookup.refused,
            };
            if let Err(e) = ledger.append(entry) {
                warn!(error = %e, "cannot record a DNS lookup");
            }
        });
        let udp = dns::serve_udp(udp, names.clone(), record.clone(), crate::util::until(stop));
        let tcp = dns::serve_tcp(tcp, names, record, crate::util::until(stop));
        async move {
            tokio::join!(udp, tcp);
        }
    });
    tokio::spawn(async move {
        let dns = async move {
            if let Some(dns) = dns {
                dns.await;
            }
        };
        let (tcp, sink, ()) = tokio::join!(tcp, sink, dns);
        tcp.and(sink)
    })
}

/// A DNS query type as people write it.
fn qtype_name(qtype: u16) -> String {
    match qtype {
        1 => "A".into(),
        5 => "CNAME".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        255 => "ANY".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> RulesetParams {
        RulesetParams {
            proxy_uid: Some(14741),
            https_port: 8443,
            http_port: 8081,
            quic_port: 8444,
            allow_quic: false,
            egress_ports: Vec::new(),
            exempt_mark: false,
            resolvers: vec!["10.0.0.2".parse().unwrap(), "fd00::53".parse().unwrap()],
            dns_stub: None,
        }
    }

    #[test]
    fn the_default_ruleset_covers_every_tcp_port_and_all_udp() {
        let r = ruleset(&params());
        assert!(r.contains("table inet veris"));
        assert!(r.contains("meta skuid 14741 return"));
        assert!(
            !r.contains("meta mark"),
            "the mark is for rootless namespaces only"
        );
        assert!(r.contains("tcp dport 80 redirect to :8081"));
        assert!(r.contains("tcp dport { 0-65535 } redirect to :8443"));
        assert!(r.contains("udp dport 443 redirect to :8444"));
        assert!(r.contains("udp dport 8444 ct original proto-dst 443"));
        assert!(r.contains("udp dport 53 ip daddr { 10.0.0.2 } return"));
        assert!(r.contains("udp dport 53 ip6 daddr { fd00::53 } return"));
        assert!(r.contains("meta l4proto udp counter name udp_dropped drop"));
        assert!(!r.contains("udp dport 443 return"));
        assert!(!r.contains('@'), "every placeholder is filled: {r}");
        let c = params().coverage("veris");
        assert_eq!(
            (c.tcp_ports, c.quic.as_str(), c.udp_other.as_str()),
            (None, "sink", "dropped")
        );
    }

    #[test]
    fn narrower_rules_are_what_the_coverage_says() {
        let mut p = params();
        p.allow_quic = true;
        p.egress_ports = vec![443];
        p.exempt_mark = true;
        p.resolvers.clear();
        let r = ruleset(&p);
        assert!(r.contains("tcp dport { 443 } redirect to :8443"));
        assert!(
            !r.contains("tcp dport 80 redirect"),
            "80 is not in the egress ports: {r}"
        );
        assert!(!r.contains("udp dport 443 redirect"));
        assert!(r.contains("udp dport 443 return"));
        assert!(!r.contains("dport 53"));
        let mark = format!(
            "meta mark {:#x} return",
            veris_proxy::outbound::dial::EXEMPT_MARK
        );
        assert!(r.contains(&mark), "rootless: the dial mark is exempt: {r}");
        let c = p.coverage("veris");
        assert_eq!(c.tcp_ports, Some(vec![443]));
        assert_eq!(c.quic, "open");
        assert!(c.exempt.iter().any(|e| e.starts_with("mark")));
    }

    #[test]
    fn the_isolated_ruleset_exempts_nothing_and_sends_dns_to_the_stub() {
        let r = ruleset(&RulesetParams {
            proxy_uid: None,
            resolvers: Vec::new(),
            dns_stub: Some((5353, 5354)),
            ..params()
        });
        assert!(!r.contains("skuid"), "nothing is exempt: {r}");
        assert!(!r.contains("meta mark"));
        assert!(r.contains("udp dport 53 redirect to :5353"));
        assert!(r.contains("tcp dport 53 redirect to :5354"));
        assert!(!r.contains('@'), "every placeholder filled: {r}");
        // DNS goes to the stub before loopback returns, so a resolver on
        // 127.0.0.53 is answered by it too.
        assert!(r.find("udp dport 53 redirect").unwrap() < r.find("ip daddr 127.0.0.0/8").unwrap());
        let c = RulesetParams {
            proxy_uid: None,
            resolvers: Vec::new(),
            dns_stub: Some((5353, 5354)),
            ..params()
        }
        .coverage("veris");
        assert_eq!(c.dns, "stub");
        assert!(c.exempt.is_empty());
        // The transparent tier's rules never mention the stub.
        assert!(!ruleset(&params()).contains("redirect to :0"));
    }

    #[test]
    fn resolvers_come_from_resolv_conf() {
        let text =
            "# comment\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nsearch x\nnameserver bogus\n";
        let r = parse_resolvers(text);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].to_string(), "10.0.0.2");
    }

    #[test]
    fn only_a_lone_root_mapping_is_a_rootless_namespace() {
        assert!(maps_only_root("         0      65534          1\n"));
        assert!(maps_only_root("0 1000 1"));
        assert!(!maps_only_root("         0          0 4294967295\n"));
        assert!(!maps_only_root("0 100000 65536\n"));
        assert!(!maps_only_root("0 1000 1\n1 100000 65535\n"));
        assert!(!maps_only_root(""));
    }
}
