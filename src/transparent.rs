//! The transparent tier's process side: its flags, the nftables rules that
//! redirect the workload's TCP 80/443 to our listeners (installed with the
//! `nft` command from the ruleset in `deploy/veris.nft`), and dropping root
//! for the proxy uid before any client byte is read. The rules are removed
//! at exit only when this process installed them; a small root helper that
//! waits on a pipe does it, so the rules go even if we die without cleanup.
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
use tracing::{info, warn};

/// The ruleset, templated by `@PROXY_UID@`, `@HTTPS_PORT@`, `@HTTP_PORT@`,
/// `@QUIC_PORT@`; lines ending in `# quic` are left out with `--allow-quic`.
pub const RULESET_TEMPLATE: &str = include_str!("../deploy/veris.nft");

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
    #[arg(long, value_name = "ADDR", default_value = veris_proxy::quic::DEFAULT_QUIC_LISTEN)]
    pub quic_listen: String,
}

/// The ruleset for a proxy uid and the listener ports (`quic_port`: the UDP sink's).
pub fn ruleset(
    proxy_uid: u32,
    https_port: u16,
    http_port: u16,
    quic_port: u16,
    allow_quic: bool,
) -> String {
    let mut out = String::new();
    for line in RULESET_TEMPLATE.lines() {
        if allow_quic && line.trim_end().ends_with("# quic") {
            continue;
        }
        out.push_str(
            &line
                .replace("@PROXY_UID@", &proxy_uid.to_string())
                .replace("@HTTPS_PORT@", &https_port.to_string())
                .replace("@HTTP_PORT@", &http_port.to_string())
                .replace("@QUIC_PORT@", &quic_port.to_string()),
        );
        out.push('\n');
    }
    out
}

/// Rules this process installed: removed when dropped (or when we die,
/// since the helper's pipe then closes).
pub struct Redirect {
    stdin: Option<ChildStdin>,
    helper: Child,
}

impl Redirect {
    /// Removes the rules and waits (bounded) until they are gone.
    pub fn remove(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        // Closing the pipe is the helper's signal.
        drop(self.stdin.take());
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
        if self.stdin.is_some() {
            self.stop();
        }
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
    let euid = privileges::euid();
    if (args.install_redirect || args.redirect_external) && rootless_namespace() {
        // Nothing else would exempt our passthrough dials: without the mark
        // they would loop back to our own listeners.
        veris_proxy::dial::check_mark().context("rootless namespace (uid 0 is the only uid mapped): veris cannot mark its own dials (SO_MARK), and the uid exemption cannot tell it from the workload. Next: run it in a network namespace owned by its user namespace (`unshare -rn`), or as real root")?;
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

/// After the listeners are bound and before any is served: installs the
/// redirect when asked, hands the state to the proxy uid and drops root.
/// `quic` is the UDP sink (none with `--allow-quic`).
pub fn engage(
    args: &TransparentArgs,
    https: SocketAddr,
    http: SocketAddr,
    quic: Option<SocketAddr>,
    owned_dirs: &[&Path],
) -> Result<Option<Redirect>> {
    let redirect = if args.install_redirect {
        let quic_port = quic.map_or(0, |q| q.port());
        Some(install(args, https.port(), http.port(), quic_port)?)
    } else {
        None
    };
    if (args.install_redirect || args.redirect_external) && rootless_namespace() {
        info!(
            mark = %format_args!("{:#x}", veris_proxy::dial::EXEMPT_MARK),
            "rootless namespace: keeping uid 0 (the only uid mapped); own dials are exempt by mark"
        );
    } else if privileges::euid() == 0 && (args.install_redirect || args.redirect_external) {
        let gid = primary_gid(args.proxy_uid);
        for dir in owned_dirs {
            chown_tree(dir, args.proxy_uid, gid)
                .with_context(|| format!("handing {} to uid {}", dir.display(), args.proxy_uid))?;
        }
        privileges::drop_to(args.proxy_uid, gid).context("dropping privileges")?;
        info!(
            uid = args.proxy_uid,
            gid, "dropped root; serving as the proxy uid"
        );
    } else if privileges::euid() == 0 {
        warn!("transparent listeners run as root without a redirect from veris: make sure the rules exempt root, or pass --install-redirect");
    }
    Ok(redirect)
}

fn install(
    args: &TransparentArgs,
    https_port: u16,
    http_port: u16,
    quic_port: u16,
) -> Result<Redirect> {
    refuse_existing_table()?;
    let rules = ruleset(
        args.proxy_uid,
        https_port,
        http_port,
        quic_port,
        args.allow_quic,
    );
    let mut nft = Command::new("nft")
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
    // The remover: waits for its stdin to close (our exit, clean or not),
    // then deletes the table. Its own process group keeps a terminal's ^C
    // from killing it before it has done so.
    use std::os::unix::process::CommandExt as _;
    let spawned = Command::new("sh")
        .args([
            "-c",
            &format!("cat >/dev/null; exec nft delete table inet {TABLE}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn();
    let mut helper = match spawned {
        Ok(helper) => helper,
        Err(e) => {
            // Without the remover the rules would outlive us: take them back out.
            let _ = Command::new("nft")
                .args(["delete", "table", "inet", TABLE])
                .status();
            return Err(e).context("starting the redirect remover");
        }
    };
    let stdin = helper.stdin.take();
    info!(
        proxy_uid = args.proxy_uid,
        https_port,
        http_port,
        quic_port,
        quic_redirected = !args.allow_quic,
        "installed the nftables redirect (table inet {TABLE})"
    );
    Ok(Redirect { stdin, helper })
}

/// Rules this process did not install are never taken over (nor removed later).
fn refuse_existing_table() -> Result<()> {
    let exists = Command::new("nft")
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
    privileges::euid() == 0
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

/// `chown -R` without following symlinks, bounded by the tree's size.
fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

mod privileges {
    //! setgroups/setgid/setuid: the only unsafe code of this module, each call
    //! a plain syscall with integer arguments.
    #![allow(unsafe_code)]

    pub fn euid() -> u32 {
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        unsafe { libc::geteuid() }
    }

    /// Drops every group, then gid, then uid (in that order: after setuid we
    /// could no longer change groups), and verifies root cannot be regained.
    /// glibc applies each call to every thread of the process.
    pub fn drop_to(uid: u32, gid: u32) -> std::io::Result<()> {
        let groups = [gid];
        // SAFETY: the pointer and length describe `groups`, alive for the call.
        if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: integer-only syscalls.
        if unsafe { libc::setgid(gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::setuid(uid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getters and a setuid(0) that must fail; integer-only.
        let (ruid, euid, rgid, egid, regained) = unsafe {
            (
                libc::getuid(),
                libc::geteuid(),
                libc::getgid(),
                libc::getegid(),
                libc::setuid(0) == 0,
            )
        };
        if ruid != uid || euid != uid || rgid != gid || egid != gid || regained {
            return Err(std::io::Error::other(format!(
                "privilege drop did not stick (uid {ruid}/{euid}, gid {rgid}/{egid}, root regained: {regained})"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_is_templated_and_quic_can_be_left_out() {
        let r = ruleset(14741, 8443, 8081, 8444, false);
        assert!(r.contains("table inet veris"));
        assert!(r.contains("meta skuid 14741 return"));
        let mark = format!("meta mark {:#x} return", veris_proxy::dial::EXEMPT_MARK);
        assert!(r.contains(&mark), "the ruleset exempts the dial mark: {r}");
        assert!(r.contains("tcp dport 443 redirect to :8443"));
        assert!(r.contains("tcp dport 80 redirect to :8081"));
        assert!(r.contains("quic_dropped"));
        assert!(r.contains("udp dport 443 redirect to :8444"));
        assert!(r.contains("udp dport 8444 ct original proto-dst 443"));
        assert!(!r.contains('@'), "every placeholder is filled: {r}");
        let r = ruleset(14741, 8443, 8081, 8444, true);
        assert!(!r.contains("udp dport 443"));
        assert!(!r.contains("udp dport 8444"));
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
